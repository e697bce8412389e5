"""Dense attention references (the math of upstream flash-attn's ``attention_ref``), any device, any dtype.

Layout is flash-attn's: ``(batch, seqlen, heads, head_dim)``. With ``upcast=True`` everything runs in fp32
(the reference); with ``upcast=False, reorder_ops=True`` the same math runs in the inputs' low precision
with torch ops, which measures PyTorch's own low-precision error (the yardstick of the tolerance rule).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def local_mask(
    seqlen_q: int,
    seqlen_k: int,
    window: tuple[int, int],
    device: Any = None,
    q_lens: Tensor | None = None,
    k_lens: Tensor | None = None,
) -> Tensor:
    """True where a query may NOT attend, for flash-attn's bottom-right aligned window (-1 = unbounded).

    ``q_lens``/``k_lens`` (per batch) align each sequence of a padded batch; the result broadcasts to
    ``(batch, heads, seqlen_q, seqlen_k)``.
    """
    row = torch.arange(seqlen_q, device=device, dtype=torch.long).view(-1, 1)
    col = torch.arange(seqlen_k, device=device, dtype=torch.long)
    sk: Any = seqlen_k if k_lens is None else k_lens.view(-1, 1, 1, 1)
    sq: Any = seqlen_q if q_lens is None else q_lens.view(-1, 1, 1, 1)
    left, right = window
    if left < 0:
        beyond: Tensor = col > row + sk - sq + right
        return beyond
    sk_t = torch.full_like(col, seqlen_k) if k_lens is None else sk
    upper = row + sk - sq + right if right >= 0 else row + sk - sq + seqlen_k
    return torch.logical_or(col > torch.minimum(upper, sk_t), col < row + sk - sq - left)


def alibi_bias(
    slopes: Tensor,
    seqlen_q: int,
    seqlen_k: int,
    causal: bool,
    q_lens: Tensor | None = None,
    k_lens: Tensor | None = None,
) -> Tensor:
    """flash-attn's ALiBi bias, ``(batch, heads, seqlen_q, seqlen_k)`` broadcastable, fp32."""
    s = slopes.float().view(slopes.shape[0], slopes.shape[1], 1, 1)
    if causal and q_lens is None and k_lens is None:
        return torch.arange(-seqlen_k + 1, 1, device=slopes.device, dtype=torch.float32) * s
    row = torch.arange(seqlen_q, device=slopes.device, dtype=torch.long).view(-1, 1)
    col = torch.arange(seqlen_k, device=slopes.device, dtype=torch.long)
    sk: Any = seqlen_k if k_lens is None else k_lens.view(-1, 1, 1, 1)
    sq: Any = seqlen_q if q_lens is None else q_lens.view(-1, 1, 1, 1)
    rel = torch.abs(row + sk - sq - col)
    return -s * rel.to(torch.float32)


def attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    bias: Tensor | None = None,
    mask: Tensor | None = None,
    q_pad: Tensor | None = None,
    k_pad: Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_mask: Tensor | None = None,
    scale: float | None = None,
    upcast: bool = True,
    reorder_ops: bool = False,
) -> tuple[Tensor, Tensor]:
    """Attention by the textbook: returns ``(out, probs)`` in the inputs' dtype.

    ``mask``: bool, True = attend, broadcastable to ``(b, h, sq, sk)`` (FlexAttention's block masks as a dense
    tensor). ``q_pad``/``k_pad``: bool ``(b, s)``, True = real token (varlen as padding). ``bias``: added to the
    scores after softcap (ALiBi). GQA/MQA: K and V heads are repeated to the query heads.
    """
    if causal:
        window = (window[0], 0)
    dtype_og = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    b, seqlen_q, hq, d = q.shape
    seqlen_k, hk = k.shape[1], k.shape[2]
    if hq % hk:
        raise ValueError(f"query heads {hq} are not a multiple of key heads {hk}")
    k = k.repeat_interleave(hq // hk, dim=2)
    v = v.repeat_interleave(hq // hk, dim=2)
    sc = (1.0 / math.sqrt(d)) if scale is None else scale
    if not reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q * sc, k)
    else:
        scores = torch.einsum("bthd,bshd->bhts", q, k * sc)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    q_lens = q_pad.sum(-1) if q_pad is not None else None
    k_lens = k_pad.sum(-1) if k_pad is not None else None
    blocked = torch.zeros((1, 1, 1, 1), dtype=torch.bool, device=q.device)
    if k_pad is not None:
        blocked = blocked | (~k_pad).view(b, 1, 1, seqlen_k)
    if window[0] >= 0 or window[1] >= 0:
        blocked = blocked | local_mask(seqlen_q, seqlen_k, window, q.device, q_lens, k_lens)
    if mask is not None:
        blocked = blocked | ~mask
    scores = scores.masked_fill(blocked, float("-inf"))
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    # rows with nothing to attend to are zero, not NaN (flash-attn's convention)
    probs = probs.masked_fill(torch.all(blocked, dim=-1, keepdim=True), 0.0)
    if q_pad is not None:
        probs = probs.masked_fill((~q_pad).view(b, 1, seqlen_q, 1), 0.0)
    dropped = probs if dropout_mask is None else probs.masked_fill(~dropout_mask, 0.0)
    out = torch.einsum("bhts,bshd->bthd", dropped, v * (1.0 / (1.0 - dropout_p)))
    if q_pad is not None:
        out = out.masked_fill((~q_pad).view(b, seqlen_q, 1, 1), 0.0)
    return out.to(dtype_og), probs.to(dtype_og)


def dropout_fraction(keep: Tensor, blocked: Tensor | None = None) -> float:
    """Dropped fraction of the attendable entries; ``keep``: bool ``(b, h, sq, sk)``, True = kept."""
    valid = torch.ones_like(keep) if blocked is None else ~blocked.expand_as(keep)
    n = int(valid.sum().item())
    if n == 0:
        return 0.0
    return float(((~keep) & valid).sum().item()) / n


def blocked_positions(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    device: Any = None,
) -> Tensor:
    """The positions flash-attn never scores (True = blocked), ``(1, 1, sq, sk)``."""
    if causal:
        window = (window[0], 0)
    if window[0] < 0 and window[1] < 0:
        return torch.zeros((1, 1, seqlen_q, seqlen_k), dtype=torch.bool, device=device)
    return local_mask(seqlen_q, seqlen_k, window, device).view(1, 1, seqlen_q, seqlen_k)


def pad_mask_from_lens(lens: list[int], max_len: int, device: Any = None) -> Tensor:
    """``(b, max_len)`` bool, True for the first ``lens[i]`` positions of row i."""
    ar = torch.arange(max_len, device=device).view(1, -1)
    return ar < torch.tensor(lens, device=device).view(-1, 1)


def unpad(x: Tensor, pad: Tensor) -> tuple[Tensor, Tensor, int]:
    """``(b, s, ...)`` + bool pad -> ``(total, ...)``, int32 cu_seqlens, max seqlen (flash-attn's varlen form)."""
    lens = pad.sum(-1, dtype=torch.int32)
    cu = torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    return x[pad], cu, int(lens.max().item())


def repad(x: Tensor, pad: Tensor) -> Tensor:
    """Inverse of ``unpad``: ``(total, ...)`` -> ``(b, s, ...)`` with zeros in the padding."""
    out = x.new_zeros((*pad.shape, *x.shape[1:]))
    out[pad] = x
    return out
