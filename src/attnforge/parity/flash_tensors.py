"""What the FA2 and FA3 parity cases share: their random inputs, autograd leaves, the fp32 and low-precision
references from the same inputs, varlen lengths, and the result of a set of checks."""

from __future__ import annotations

from typing import Any

import torch

from attnforge import reference as R
from attnforge.parity.cases import Case
from attnforge.parity.parity_report import FAILED, PASSED, Result
from attnforge.parity.tolerance import Check, worst

SUITE = "flash_attn"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SUITE = "flash_attn"


class Inputs:
    """Random inputs of one case (fresh draws per case), in flash-attn's (b, s, h, d) layout."""

    def __init__(self, c: Case, device: str, seed: int) -> None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        dt = DTYPES[c.dtype]

        def rnd(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g).to(device=device, dtype=dt)

        dv = c.dv or c.d
        self.q = rnd(c.b, c.sq, c.hq, c.d)
        self.k = rnd(c.b, c.sk, c.hk, c.d)
        self.v = rnd(c.b, c.sk, c.hk, dv)
        self.g = rnd(c.b, c.sq, c.hq, dv)
        self.slopes = (torch.rand(c.b, c.hq, generator=g) * 0.3).to(device=device) if c.alibi else None


def autograd_grads(out: torch.Tensor, leaves: list[torch.Tensor], g: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of `out` (upstream gradient `g`) with respect to `leaves`."""
    return list(torch.autograd.grad(out, leaves, g))


def fresh_leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """A fresh autograd leaf with the values of `t`."""
    return t.detach().clone().requires_grad_(grad)


def reference_outputs(
    c: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: bool, **kw: Any
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[torch.Tensor]]]:
    """(fp32 ref outputs, torch low-precision outputs, leaves [ref, pt]) for the same inputs."""
    outs: list[torch.Tensor] = []
    leaves: list[list[torch.Tensor]] = []
    for upcast in (True, False):
        lq, lk, lv = fresh_leaf(q, grad), fresh_leaf(k, grad), fresh_leaf(v, grad)
        o, _ = R.attention_ref(
            lq,
            lk,
            lv,
            causal=c.causal,
            window=c.window,
            softcap=c.softcap,
            upcast=upcast,
            reorder_ops=not upcast,
            **kw,
        )
        outs.append(o)
        leaves.append([lq, lk, lv])
    return [outs[0]], [outs[1]], leaves


def varlen_lengths(b: int, max_len: int, seed: int) -> list[int]:
    """Random sequence lengths for a varlen batch of `b`, the first one full length."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(max(1, max_len // 3), max_len + 1, (b,), generator=g).tolist()
    lens[0] = max_len  # one full-length sequence
    return [int(x) for x in lens]


def case_result(
    c: Case,
    pass_: str,
    checks: list[Check],
    extra_ok: bool,
    extra_reason: str,
    notes: dict[str, Any],
    suite: str = SUITE,
) -> Result:
    """One parity result from its checks: passed when every check and the extra condition hold."""
    w = worst(checks)
    ok = all(x.ok for x in checks) and extra_ok
    reason = (
        ""
        if ok
        else (
            extra_reason
            or f"{w.name}: max_err {w.max_err:.3g} > bound {w.bound:.3g} "
            f"({w.factor:g} x torch {w.torch_err:.3g} + eps {w.eps:.2g})"
        )
    )
    details: dict[str, Any] = {
        x.name: {"max_err": x.max_err, "torch_err": x.torch_err, "ratio": x.ratio} for x in checks
    } | notes
    return Result(
        suite,
        f"{c.kernel_name}:{pass_}",
        c.dtype,
        c.shape,
        PASSED if ok else FAILED,
        max_err=w.max_err,
        ratio_vs_torch=w.ratio,
        reason=reason,
        details=details,
    )
