"""FlexAttention (compiled) and PyTorch's SDPA backends vs the fp32 reference, fwd and bwd, on the GPU."""

from __future__ import annotations

from typing import Any

import pytest

from attnforge.parity.parity_report import FAILED, SKIPPED

pytestmark = pytest.mark.gpu


def _flex() -> list[dict[str, Any]]:
    try:
        from attnforge.parity.flexcases import parity_variants
    except ImportError:  # no torch here: the tests skip anyway
        return [{"name": "flex"}]
    return parity_variants()


@pytest.mark.parametrize("variant", _flex(), ids=lambda v: v["name"])
def test_flex_variant(variant: dict[str, Any], record: Any) -> None:
    from attnforge.parity.flexcases import run_variant

    results = run_variant(variant, "cuda")
    record(results)
    assert not [r for r in results if r.status == FAILED], [(r.name, r.reason) for r in results]


@pytest.mark.parametrize("backend", ["flash", "efficient", "cudnn"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_backend(backend: str, dtype: str, causal: bool, record: Any) -> None:
    from attnforge.parity.sdpa import SHAPES, backends, run_one

    results = run_one(backend, backends()[backend], dtype, SHAPES[0], causal, "cuda")
    record(results)
    if all(r.status == SKIPPED for r in results):
        pytest.skip(results[0].reason)
    assert not [r for r in results if r.status == FAILED], [(r.name, r.reason) for r in results]
