"""One declared FA4 call on the GPU: its inputs, the call (forward, or forward+backward), and its errors
against SDPA in fp32 with upstream's tolerance rule (torch and FA4 only; runs in a bare GPU host's Python).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from attnforge.fa4.declare import Declaration
from attnforge.parity.tolerance import BWD_FACTOR, FWD_FACTOR, Check, check, worst
from attnforge.reference import attention_ref

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def varlen_lens(d: Declaration, seqlen: int) -> list[int]:
    """Per-sequence lengths of a packed batch: the longest is ``seqlen``, the others shorter and uneven."""
    return [max(1, seqlen - (i * seqlen) // (2 * d.batch) - 7 * i) for i in range(d.batch)]


def make_inputs(d: Declaration, seqlen: int, seed: int = 0) -> dict[str, Any]:
    """q, k, v (and the gradient of the output) for the declaration at one length, on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = DTYPES[d.dtype]
    if d.varlen:
        lens = varlen_lens(d, seqlen)
        total = sum(lens)
        shape_q: tuple[int, ...] = (total, d.heads_q, d.head_dim)
        shape_k: tuple[int, ...] = (total, d.heads_kv, d.head_dim)
        shape_v: tuple[int, ...] = (total, d.heads_kv, d.dv)
        shape_o: tuple[int, ...] = (total, d.heads_q, d.dv)
    else:
        lens = [seqlen] * d.batch
        shape_q = (d.batch, seqlen, d.heads_q, d.head_dim)
        shape_k = (d.batch, seqlen, d.heads_kv, d.head_dim)
        shape_v = (d.batch, seqlen, d.heads_kv, d.dv)
        shape_o = (d.batch, seqlen, d.heads_q, d.dv)
    q, k, v, go = (
        torch.randn(s, device="cuda", dtype=dt, generator=g) for s in (shape_q, shape_k, shape_v, shape_o)
    )
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    return {"q": q, "k": k, "v": v, "go": go, "lens": lens, "cu": cu}


def call(fa4: Any, d: Declaration, x: dict[str, Any], q: Any, k: Any, v: Any) -> Any:
    """FA4's own call path (``flash_attn_func`` / ``flash_attn_varlen_func``); returns the output."""
    if d.varlen:
        r = fa4.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens_q=x["cu"],
            cu_seqlens_k=x["cu"],
            max_seqlen_q=max(x["lens"]),
            max_seqlen_k=max(x["lens"]),
            causal=d.causal,
        )
    else:
        r = fa4.flash_attn_func(q, k, v, causal=d.causal)
    return r[0] if isinstance(r, tuple) else r


def step(fa4: Any, d: Declaration, x: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    """One call as the declaration makes it: forward, or forward + backward. Returns (out, grads)."""
    if not d.training:
        with torch.no_grad():
            return call(fa4, d, x, x["q"], x["k"], x["v"]), ()
    q, k, v = (x[n].detach().requires_grad_(True) for n in ("q", "k", "v"))
    out = call(fa4, d, x, q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), x["go"])
    return out.detach(), tuple(grads)


def _sequences(d: Declaration, x: dict[str, Any], t: Any) -> list[Any]:
    """A (B, S, H, D) tensor per sequence (varlen: split at cu_seqlens)."""
    if not d.varlen:
        return [t]
    cu = x["cu"].tolist()
    return [t[cu[i] : cu[i + 1]].unsqueeze(0) for i in range(len(cu) - 1)]


def _sdpa_fp32(q: Any, k: Any, v: Any, causal: bool) -> Any:
    o = F.scaled_dot_product_attention(
        q.float().transpose(1, 2),
        k.float().transpose(1, 2),
        v.float().transpose(1, 2),
        is_causal=causal,
        enable_gqa=True,
    )
    return o.transpose(1, 2)


def errors(fa4: Any, d: Declaration, x: dict[str, Any]) -> dict[str, Any]:
    """FA4's output (and dq, dk, dv) against SDPA in fp32; PyTorch's own low-precision error is the yardstick
    (upstream's rule: factor 2 forward, 3 backward, plus the reference's rounding)."""
    out, grads = step(fa4, d, x)
    checks: list[Check] = []
    for i, (q, k, v, o, go) in enumerate(
        zip(*(_sequences(d, x, t) for t in (x["q"], x["k"], x["v"], out, x["go"])), strict=True)
    ):
        leaves = [t.detach().float().requires_grad_(d.training) for t in (q, k, v)]
        ref = _sdpa_fp32(leaves[0], leaves[1], leaves[2], d.causal)
        low = [t.detach().requires_grad_(d.training) for t in (q, k, v)]
        pt, _ = attention_ref(*low, causal=d.causal, upcast=False, reorder_ops=True)
        checks.append(check(f"out[{i}]", o, ref, pt, FWD_FACTOR))
        if d.training:
            gref = torch.autograd.grad(ref, leaves, go.float())
            gpt = torch.autograd.grad(pt, low, go)
            mine = [_sequences(d, x, g_)[i] for g_ in grads]
            for name, a, r, p in zip(("dq", "dk", "dv"), mine, gref, gpt, strict=True):
                checks.append(check(f"{name}[{i}]", a, r, p, BWD_FACTOR))
    out_checks = [c for c in checks if c.name.startswith("out")]
    grad_checks = [c for c in checks if not c.name.startswith("out")]
    w = worst(checks)
    return {
        "max_err": max(c.max_err for c in out_checks),
        "grad_max_err": max((c.max_err for c in grad_checks), default=None),
        "ok": all(c.ok for c in checks),
        "worst": {"name": w.name, "max_err": w.max_err, "torch_err": w.torch_err, "bound": w.bound},
    }


def finite(v: float) -> float | None:
    """JSON-safe float."""
    return v if math.isfinite(v) else None
