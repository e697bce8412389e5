"""The Flex variant spec (matrix.yaml `flex.variants`): defaults, validation and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.core.errors import ConfigurationError
from attnforge.flex.defaults import DEFAULT_VARIANTS
from attnforge.flex.flex_spec import FlexVariant, load_variants, parse_variants


def test_defaults_parse_and_are_unique() -> None:
    vs = parse_variants(DEFAULT_VARIANTS)
    assert len(vs) == len(DEFAULT_VARIANTS) and {v.device for v in vs} == {"cuda", "cpu"}
    assert all(v.as_dict()["name"] == v.name for v in vs)


def test_nested_heads_and_matrix_section(tmp_path: Path) -> None:
    f = tmp_path / "matrix.yaml"
    f.write_text(
        "version: 1\nflex:\n  variants:\n"
        "    - {name: swa, mask: sliding_window, window: 128, heads: {q: 32, kv: 8}, dtype: fp16, seq_len: 4096}\n"
    )
    [v] = load_variants(f)
    assert (v.heads_q, v.heads_kv, v.window, v.dtype, v.backward, v.mode) == (
        32,
        8,
        128,
        "fp16",
        True,
        "default",
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"dtype": "fp32"}, "fp32 is not supported"),
        ({"mask": "sliding_window"}, "needs window"),
        ({"mask": "prefix_lm", "prefix": 0}, "prefix"),
        ({"score_mod": "softcap"}, "softcap > 0"),
        ({"heads_q": 12, "heads_kv": 5}, "not a multiple"),
        ({"device": "cpu", "backward": True}, "no backward on CPU"),
        ({"name": "Bad Name"}, "lowercase"),
        ({"mask": "diagonal"}, "mask"),
        ({"head_dim": 100}, "multiple of 8"),
        ({"unknown_key": 1}, "unknown_key"),
    ],
)
def test_refusals_are_clear(bad: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_variants([{"name": "v"} | bad], "matrix.yaml: flex")


def test_duplicate_names_refused() -> None:
    with pytest.raises(ConfigurationError, match="appears twice"):
        parse_variants([{"name": "a"}, {"name": "a"}])


def test_model_defaults() -> None:
    v = FlexVariant(name="x")
    assert (v.mask, v.score_mod, v.dtype, v.device, v.dynamic) == ("causal", "none", "bf16", "cuda", False)
