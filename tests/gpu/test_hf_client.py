"""Hugging Face transformers, flash_attention_2 vs low-precision eager (and sdpa), on a small random decoder."""

from __future__ import annotations

from typing import Any

import pytest

from attnforge.parity.parity_report import FAILED, SKIPPED

from .conftest import flash_profile

pytestmark = pytest.mark.gpu


def test_transformers_flash_attention_2(record: Any) -> None:
    pytest.importorskip("flash_attn", reason="flash_attn is not installed (install the wheel under test)")
    pytest.importorskip("transformers", reason="transformers is not installed on this machine")
    from attnforge.parity.hf import run

    results = run(flash_profile())
    record(results)
    if all(r.status == SKIPPED for r in results):
        pytest.skip(results[0].reason)
    assert not [r for r in results if r.status == FAILED], [(r.name, r.reason) for r in results]
