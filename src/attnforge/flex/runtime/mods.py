"""FlexAttention variants from a plain dict: mask_mod, score_mod, block mask, inputs, dense reference masks.

Shipped verbatim inside the ``attnforge_flex`` wheel (as ``attnforge_flex.mods``) and used by the builder,
so the graph a user's process traces is the graph that was compiled ahead of time. Needs torch only.

Variant dict keys: name, mask (causal | sliding_window | document | prefix_lm | full), window, prefix,
score_mod (none | alibi | softcap), softcap, dtype (bf16 | fp16), head_dim, heads_q, heads_kv, seq_len,
batch, dynamic, backward, mode (default | max-autotune), device (cuda | cpu), scale (None: 1/sqrt(head_dim)),
pad_from (length bucket), client, group.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

Variant = dict[str, Any]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DOC_FRACTIONS = (0.125, 0.375, 0.25, 0.25)


def dtype_of(v: Variant) -> torch.dtype:
    """The variant's dtype; fp32 and others are refused (FlexAttention kernels are built for bf16/fp16)."""
    name = str(v.get("dtype", "bf16"))
    if name not in DTYPES:
        raise ValueError(f"variant {v.get('name')!r}: dtype {name!r} is not supported (bf16 or fp16)")
    return DTYPES[name]


def document_ids(seq_len: int, device: Any) -> torch.Tensor:
    """Four packed documents of fixed proportions (the last takes the remainder)."""
    lens = [max(1, int(seq_len * f)) for f in DOC_FRACTIONS[:-1]]
    lens.append(max(0, seq_len - sum(lens)))
    ids = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lens)])[:seq_len]
    return ids.to(device)


def alibi_slopes(heads: int, device: Any) -> torch.Tensor:
    """The ALiBi paper's geometric slopes for ``heads`` heads (fp32)."""
    p = 2 ** math.floor(math.log2(heads))
    base = [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]
    extra = [2.0 ** (-4.0 * (2 * i + 1) / p) for i in range(heads - p)]
    return torch.tensor(base + extra, dtype=torch.float32, device=device)


def mask_mod_for(v: Variant, device: Any) -> Callable[..., Any] | None:
    """The variant's mask_mod (None for ``full``). ``document`` is causal within each document."""
    kind = v.get("mask", "causal")
    if kind == "full":
        return None
    if kind == "causal":

        def causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return q >= kv

        return causal
    if kind == "sliding_window":
        window = int(v["window"])

        def sliding_window(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return (q >= kv) & (q - kv <= window)

        return sliding_window
    if kind == "prefix_lm":
        prefix = int(v["prefix"])

        def prefix_lm(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return (kv < prefix) | (q >= kv)

        return prefix_lm
    if kind == "document":
        docs = document_ids(int(v["seq_len"]), device)

        def document(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return (docs[q] == docs[kv]) & (q >= kv)

        return document
    raise ValueError(f"variant {v.get('name')!r}: unknown mask {kind!r}")


def score_mod_for(v: Variant, device: Any) -> Callable[..., Any] | None:
    """The variant's score_mod (None for ``none``)."""
    kind = v.get("score_mod", "none") or "none"
    if kind == "none":
        return None
    if kind == "softcap":
        cap = float(v["softcap"])

        def softcap(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
            return cap * torch.tanh(score / cap)

        return softcap
    if kind == "alibi":
        slopes = alibi_slopes(int(v["heads_q"]), device)

        def alibi(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
            return score - slopes[h] * torch.abs(q - kv)

        return alibi
    raise ValueError(f"variant {v.get('name')!r}: unknown score_mod {kind!r}")


def dense_mask(v: Variant, seq_len: int, device: Any) -> torch.Tensor | None:
    """The mask as a dense bool ``(1, 1, S, S)`` tensor (True = attend), for references."""
    mm = mask_mod_for(v, device)
    if mm is None:
        return None
    q = torch.arange(seq_len, device=device).view(-1, 1)
    kv = torch.arange(seq_len, device=device).view(1, -1)
    zero = torch.zeros((), dtype=torch.long, device=device)
    return torch.as_tensor(mm(zero, zero, q, kv)).expand(seq_len, seq_len).view(1, 1, seq_len, seq_len)


def dense_bias(v: Variant, seq_len: int, device: Any) -> torch.Tensor | None:
    """ALiBi as a dense fp32 bias ``(1, H, S, S)``; None otherwise."""
    if (v.get("score_mod") or "none") != "alibi":
        return None
    slopes = alibi_slopes(int(v["heads_q"]), device).view(1, -1, 1, 1)
    pos = torch.arange(seq_len, device=device, dtype=torch.float32)
    return -slopes * (pos.view(-1, 1) - pos.view(1, -1)).abs()


def block_mask(v: Variant, device: Any, seq_len: int | None = None) -> Any:
    """``create_block_mask`` for the variant (None for ``full``), broadcast over batch and heads."""
    from torch.nn.attention.flex_attention import create_block_mask

    s = int(seq_len or v["seq_len"])
    mm = mask_mod_for(v, device)
    if mm is None:
        return None
    return create_block_mask(mm, None, None, s, s, device=device)


def make_inputs(
    v: Variant, device: Any, *, grad: bool = False, seed: int = 0, seq_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q, k, v in FlexAttention's ``(B, H, S, D)`` layout."""
    g = torch.Generator().manual_seed(seed)
    s = int(seq_len or v["seq_len"])
    b, hq, hk, d = int(v.get("batch", 1)), int(v["heads_q"]), int(v["heads_kv"]), int(v["head_dim"])
    dt = dtype_of(v)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dt).requires_grad_(grad)

    return rnd(b, hq, s, d), rnd(b, hk, s, d), rnd(b, hk, s, d)


def compiled_flex(v: Variant) -> Callable[..., Any]:
    """``torch.compile(flex_attention)`` with the variant's dynamic flag and mode."""
    from torch.nn.attention.flex_attention import flex_attention

    mode = v.get("mode", "default")
    return torch.compile(  # type: ignore[no-any-return, unused-ignore]
        flex_attention, dynamic=bool(v.get("dynamic", False)), mode=None if mode == "default" else mode
    )


class FlexCall:
    """A variant made callable: ``fn(q, k, v)`` runs the compiled (or eager) flex_attention.

    ``torch.compile`` is called at the first call, not here: it imports Dynamo and Inductor (about 2 s on the
    CI machine), which a call served by an AOTInductor package never needs."""

    def __init__(self, v: Variant, device: Any, compiled: bool = True) -> None:
        self.variant = v
        self.device = device
        self.compiled = compiled
        self.score_mod = score_mod_for(v, device)
        self._fn: Callable[..., Any] | None = None
        self._masks: dict[int, Any] = {}
        self.gqa = gqa(v)
        self.scale = scale_of(v)

    @property
    def fn(self) -> Callable[..., Any]:
        if self._fn is None:
            from torch.nn.attention.flex_attention import flex_attention

            self._fn = compiled_flex(self.variant) if self.compiled else flex_attention
        return self._fn

    def block_mask(self, seq_len: int) -> Any:
        if seq_len not in self._masks:
            self._masks[seq_len] = block_mask(self.variant, self.device, seq_len)
        return self._masks[seq_len]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        bm = self.block_mask(q.shape[-2])
        out: torch.Tensor = self.fn(
            q, k, v, score_mod=self.score_mod, block_mask=bm, enable_gqa=self.gqa, scale=self.scale
        )
        return out


def gqa(v: Variant) -> bool:
    """Whether the variant has fewer key/value heads than query heads (``enable_gqa``)."""
    return int(v["heads_q"]) != int(v["heads_kv"])


def scale_of(v: Variant) -> float | None:
    """The variant's softmax scale (None: FlexAttention's default, 1/sqrt(head_dim))."""
    s = v.get("scale")
    return None if s is None else float(s)


def precompile_args(
    v: Variant, device: Any, q: torch.Tensor, k: torch.Tensor, vv: torch.Tensor
) -> tuple[Any, ...]:
    """The arguments ``precompiled.attend`` takes: ``(q, k, v, block_mask, score_mod, gqa, scale)``."""
    return (q, k, vv, block_mask(v, device, q.shape[-2]), score_mod_for(v, device), gqa(v), scale_of(v))


class FlexModule(torch.nn.Module):  # type: ignore[misc, unused-ignore]
    """The variant as a module with its block mask fixed (what torch.export / AOTInductor takes)."""

    def __init__(self, v: Variant, device: Any) -> None:
        super().__init__()
        self.variant = v
        self.score_mod = score_mod_for(v, device)
        self.bm = block_mask(v, device)
        self.gqa = gqa(v)
        self.scale = scale_of(v)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        out: torch.Tensor = flex_attention(
            q, k, v, score_mod=self.score_mod, block_mask=self.bm, enable_gqa=self.gqa, scale=self.scale
        )
        return out
