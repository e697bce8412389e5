"""GPU tests: skipped with a reason where no CUDA GPU (or no torch) is visible; never mocked.

The flash-attn tests take the wheel's profile from ``$ATTNFORGE_PARITY_MANIFEST`` (the wheel's
``<wheel>.manifest.json``) or else from the installed flash_attn's local version and matrix.yaml.
``$ATTNFORGE_PARITY_OUT`` (optional): write parity.json/.md/.junit.xml of the session there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return (
            False,
            "no CUDA GPU visible (GPU tests run on the GPU machine: nox -s gpu-validate, docs/gpu-parity.md)",
        )
    return True, ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ok, why = _cuda()
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if not ok:
                item.add_marker(pytest.mark.skip(reason=why))


_RESULTS: list[Any] = []


@pytest.fixture(scope="session")
def record() -> Any:
    """Collects parity Results; written as a report at session end when $ATTNFORGE_PARITY_OUT is set."""
    return _RESULTS.extend


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get("ATTNFORGE_PARITY_OUT")
    if not out or not _RESULTS:
        return
    import torch

    from attnforge.parity.parity_report import Report
    from attnforge.parity.parity_run import device_name

    rep = Report(
        device_name(), torch.__version__, os.environ.get("ATTNFORGE_PARITY_WHEEL"), None, list(_RESULTS)
    )
    rep.write(Path(out))


def flash_profile() -> Any:
    from attnforge.parity import profile as P

    manifest = os.environ.get("ATTNFORGE_PARITY_MANIFEST")
    try:
        from importlib.metadata import version

        v = version("flash_attn")
    except Exception:
        v = None
    return P.resolve(Path(manifest) if manifest else None, v, ROOT / "matrix.yaml")
