"""Upstream flash-attn's tolerance rule, applied and recorded.

A kernel's output passes when its largest absolute error against the fp32 reference is at most ``factor``
times PyTorch's own error for the same math in the low-precision dtype, plus a small eps: the rounding error
of the reference's own values in that dtype (upstream's ``(ref + 0.3 - 0.3 - ref).abs().max()``).
Upstream uses factor 2 for forward outputs and 3 for gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FWD_FACTOR = 2.0
BWD_FACTOR = 3.0
MIN_EPS = 1e-6


@dataclass(frozen=True)
class Check:
    """One compared tensor: errors against the fp32 reference and the verdict."""

    name: str
    max_err: float
    torch_err: float
    eps: float
    factor: float

    @property
    def bound(self) -> float:
        return self.factor * self.torch_err + self.eps

    @property
    def ratio(self) -> float:
        """Kernel error over PyTorch's error (eps stands in when PyTorch's is zero)."""
        return self.max_err / max(self.torch_err, self.eps, MIN_EPS)

    @property
    def ok(self) -> bool:
        return math.isfinite(self.max_err) and self.max_err <= self.bound


def max_abs_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| in fp32; NaN or inf anywhere in x gives inf (never passes)."""
    xf, rf = x.detach().float(), ref.detach().float()
    if not bool(torch.isfinite(xf).all()):
        return math.inf
    if xf.numel() == 0:
        return 0.0
    return float((xf - rf).abs().max().item())


def rel_l2_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| (Frobenius, fp32); NaN or inf anywhere in x gives inf (never passes).

    For a whole model's gradients (the real-client test), where one element's max error says little."""
    xf, rf = x.detach().float(), ref.detach().float()
    if not bool(torch.isfinite(xf).all()):
        return math.inf
    return float((xf - rf).norm().item() / max(float(rf.norm().item()), MIN_EPS))


def rounding_eps(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The reference's own rounding error in ``dtype`` (upstream hopper tests' atol, doubled)."""
    r = ref.detach().to(dtype)
    if r.numel() == 0:
        return MIN_EPS
    return max(2.0 * float((r + 0.3 - 0.3 - r).abs().max().item()), MIN_EPS)


def check(
    name: str, out: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor, factor: float = FWD_FACTOR
) -> Check:
    """Compare ``out`` (kernel) and ``torch_out`` (PyTorch low precision) with the fp32 ``ref``."""
    return Check(
        name=name,
        max_err=max_abs_err(out, ref),
        torch_err=max_abs_err(torch_out, ref),
        eps=rounding_eps(ref, torch_out.dtype if torch_out.dtype != torch.float32 else out.dtype),
        factor=factor,
    )


def worst(checks: list[Check]) -> Check:
    """The check with the largest ratio (the one a case reports)."""
    if not checks:
        raise ValueError("no checks")
    return max(checks, key=lambda c: (not c.ok, c.ratio))
