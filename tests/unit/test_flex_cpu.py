"""FlexAttention on CPU against the fp32 reference: every mask and score_mod the builder knows (forward:
FlexAttention has no CPU backward). Eager path here; the compiled CPU path runs in tests/integration."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from attnforge.flex.runtime import mods  # noqa: E402
from attnforge.parity.flexcases import parity_variants, run_variant  # noqa: E402
from attnforge.parity.parity_report import PASSED  # noqa: E402


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_flex_masks_and_score_mods_match_the_reference(dtype: str) -> None:
    for v in parity_variants(seq_len=131, dtypes=(dtype,)):
        v = v | {"device": "cpu", "batch": 1}
        [r] = run_variant(v, "cpu", compiled=False)
        assert r.status == PASSED, (r.name, r.reason)
        assert r.ratio_vs_torch is not None and r.ratio_vs_torch <= 2.0


def test_dense_masks_have_the_intended_shape() -> None:
    base = {"seq_len": 64, "heads_q": 4, "heads_kv": 4}
    causal = mods.dense_mask(base | {"mask": "causal"}, 8, "cpu")[0, 0]
    assert causal.tolist() == torch.ones(8, 8).tril().bool().tolist()
    swa = mods.dense_mask(base | {"mask": "sliding_window", "window": 2}, 8, "cpu")[0, 0]
    assert swa[5].nonzero().flatten().tolist() == [3, 4, 5]
    prefix = mods.dense_mask(base | {"mask": "prefix_lm", "prefix": 3}, 8, "cpu")[0, 0]
    assert prefix[0].nonzero().flatten().tolist() == [0, 1, 2]
    doc = mods.dense_mask(base | {"mask": "document"}, 64, "cpu")[0, 0]
    ids = mods.document_ids(64, "cpu")
    assert ids.unique().tolist() == [0, 1, 2, 3] and not doc[ids.tolist().index(1), 0]
    assert mods.dense_mask(base | {"mask": "full"}, 8, "cpu") is None
    with pytest.raises(ValueError, match="not supported"):
        mods.dtype_of({"name": "x", "dtype": "fp32"})
