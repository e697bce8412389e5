"""flash-attn wheel under test vs the fp32 reference (every case its profile calls for)."""

from __future__ import annotations

from typing import Any

import pytest

from attnforge.parity.cases import Case, flash_cases
from attnforge.parity.parity_report import FAILED, SKIPPED

from .conftest import flash_profile

pytestmark = pytest.mark.gpu


def _cases() -> list[Case]:
    """The wheel's profile's cases; a profile that cannot be read is a collection error, never zero cases."""
    return flash_cases(flash_profile())


@pytest.fixture(scope="module")
def fa() -> Any:
    return pytest.importorskip(
        "flash_attn", reason="flash_attn is not installed (install the wheel under test)"
    )


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.id)
def test_flash_attn_case(fa: Any, case: Case, record: Any) -> None:
    from attnforge.parity.flash import run_case, run_case_isolated

    results = run_case_isolated(case) if case.expect_error else run_case(fa, case)
    record(results)
    failed = [r for r in results if r.status == FAILED]
    assert not failed, "; ".join(f"{r.name}: {r.reason}" for r in failed)
    skipped = [r for r in results if r.status == SKIPPED]
    if skipped and len(skipped) == len(results):
        pytest.skip(skipped[0].reason)
