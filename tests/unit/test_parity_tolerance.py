"""Upstream's tolerance rule: kernel error <= factor x PyTorch's low-precision error + eps, ratios recorded."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from attnforge import reference as R  # noqa: E402
from attnforge.parity.tolerance import BWD_FACTOR, FWD_FACTOR, Check, check, max_abs_err, worst  # noqa: E402


def test_bound_ratio_and_nan() -> None:
    c = Check("out", max_err=0.02, torch_err=0.01, eps=0.001, factor=2.0)
    assert c.ok and c.bound == pytest.approx(0.021) and c.ratio == pytest.approx(2.0)
    assert not Check("out", 0.03, 0.01, 0.001, 2.0).ok
    assert not Check("out", math.inf, 0.01, 0.001, 2.0).ok
    assert max_abs_err(torch.tensor([float("nan")]), torch.tensor([0.0])) == math.inf
    assert Check("x", 0.0, 0.0, 1e-3, 2.0).ratio == 0.0
    assert worst([Check("a", 1, 1, 0, 2), Check("b", 3, 1, 0, 2), Check("c", 2, 1, 0, 2)]).name == "b"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_low_precision_kernel_passes_and_a_wrong_one_fails(dtype: str) -> None:
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 65, 4, 32, generator=g).to(dt) for _ in range(3))
    ref, _ = R.attention_ref(q, k, v, causal=True)  # fp32 math, cast to dt
    pt, _ = R.attention_ref(q, k, v, causal=True, upcast=False, reorder_ops=True)
    # a "kernel" computing in fp32 and rounding once is at least as good as torch's low-precision math
    good = check("out", ref, ref.float(), pt, FWD_FACTOR)
    assert good.ok and good.ratio <= 1.0
    # the same math in low precision without reordering: within the rule
    other, _ = R.attention_ref(q, k, v, causal=True, upcast=False)
    assert check("out", other, ref.float(), pt, FWD_FACTOR).ok
    # a kernel that ignores the causal mask is far outside it
    wrong, _ = R.attention_ref(q, k, v, causal=False)
    bad = check("out", wrong, ref.float(), pt, FWD_FACTOR)
    assert not bad.ok and bad.ratio > 10
    assert BWD_FACTOR > FWD_FACTOR
