"""PyTorch's SDPA backends (flash, memory-efficient, cuDNN) against the same fp32 reference, fwd and bwd.

They are references in their own right: a wheel whose error ratios are far above theirs is suspect."""

from __future__ import annotations

import time
from typing import Any

import torch

from attnforge import reference as R
from attnforge.parity.parity_report import FAILED, PASSED, SKIPPED, Result
from attnforge.parity.tolerance import BWD_FACTOR, FWD_FACTOR, check, worst

SUITE = "sdpa"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SHAPES = ((2, 8, 1023, 128), (2, 16, 257, 64))


def backends() -> dict[str, Any]:
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }


def run_all(device: str = "cuda") -> list[Result]:
    out: list[Result] = []
    for bname, backend in backends().items():
        for dtype in DTYPES:
            for b, h, s, d in SHAPES:
                for causal in (False, True):
                    out += run_one(bname, backend, dtype, (b, h, s, d), causal, device)
    return out


def run_one(
    bname: str, backend: Any, dtype: str, shape: tuple[int, int, int, int], causal: bool, device: str
) -> list[Result]:
    from torch.nn.attention import sdpa_kernel

    b, h, s, d = shape
    kernel = f"sdpa_{bname}[{'causal' if causal else 'full'}]"
    sh = f"b{b} s{s} h{h} d{d}"
    g = torch.Generator().manual_seed(11)
    q, k, v, go = (
        torch.randn(b, h, s, d, generator=g).to(device=device, dtype=DTYPES[dtype]) for _ in range(4)
    )
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    t0 = time.perf_counter()
    try:
        with sdpa_kernel([backend]):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            grads = torch.autograd.grad(o, (q, k, v), go)
    except RuntimeError as exc:
        msg = str(exc).strip().splitlines()
        return [
            Result(
                SUITE,
                kernel + ":fwd",
                dtype,
                sh,
                SKIPPED,
                reason=f"backend unavailable here: {msg[0] if msg else ''}",
            )
        ]
    refs, leaves = [], []
    for upcast in (True, False):
        lq, lk, lv = (t.detach().transpose(1, 2).clone().requires_grad_(True) for t in (q, k, v))
        r, _ = R.attention_ref(lq, lk, lv, causal=causal, upcast=upcast, reorder_ops=not upcast)
        refs.append(r.transpose(1, 2))
        leaves.append([lq, lk, lv])
    fwd = check("out", o, refs[0], refs[1], FWD_FACTOR)
    g_ref = torch.autograd.grad(refs[0], leaves[0], go)
    g_pt = torch.autograd.grad(refs[1], leaves[1], go)
    bwd = [
        check(n, a, r.transpose(1, 2), p.transpose(1, 2), BWD_FACTOR)
        for n, a, r, p in zip(("dq", "dk", "dv"), grads, g_ref, g_pt, strict=True)
    ]
    dt = (time.perf_counter() - t0) / 2
    res = []
    for pass_, checks in (("fwd", [fwd]), ("bwd", bwd)):
        w = worst(checks)
        ok = all(c.ok for c in checks)
        res.append(
            Result(
                SUITE,
                f"{kernel}:{pass_}",
                dtype,
                sh,
                PASSED if ok else FAILED,
                max_err=w.max_err,
                ratio_vs_torch=w.ratio,
                seconds=dt,
                reason="" if ok else f"{w.name}: max_err {w.max_err:.3g} > bound {w.bound:.3g}",
            )
        )
    return res
