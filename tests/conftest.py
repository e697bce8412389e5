"""Shared fixtures: the repository root, the small compat table, and a CLI runner returning exit codes."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.cli import main
from attnforge.compat import CompatData, load_compat

ROOT = Path(__file__).resolve().parents[1]
MINI_COMPAT = ROOT / "tests" / "data" / "compat_mini.toml"


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def mini_compat() -> CompatData:
    return load_compat(str(MINI_COMPAT))


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run `attnforge ARGS` in-process; returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def docker_available() -> bool:
    if not shutil.which("docker") and not Path("/usr/bin/docker").exists():
        return False
    return subprocess.run(["/usr/bin/docker", "info"], capture_output=True, check=False).returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Docker tests skip with a reason when no engine answers (CI starts one: it must not skip there)."""
    if docker_available():
        return
    import os

    if os.environ.get("CI"):
        return  # in CI a missing engine is a failure, not a skip
    skip = pytest.mark.skip(reason="no Docker engine reachable (start dockerd; .ci/run does)")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)
