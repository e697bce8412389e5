"""Shared fixtures: the repository root, the small compat table, and a CLI runner returning exit codes."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.cli import main
from attnforge.matrix.compat import CompatData, load_compat

ROOT = Path(__file__).resolve().parents[1]
MINI_COMPAT = ROOT / "tests" / "data" / "compat_mini.toml"

# matrix.yaml's FA3 source is the upstream commit (git); these machines can't reach GitHub, so the tests take
# its pinned snapshot from the shared folder beside the checkout (CI and the GPU machine set their own).
os.environ.setdefault("ATTNFORGE_SOURCES", str(ROOT.parent / "shared" / "sources"))

# The user's own configuration is never written: a test that signs without a configured key makes the local key
# in this run's own folder (`$ATTNFORGE_CONFIG_DIR`, inherited by every subprocess), removed at exit.
# `pytest_sessionfinish` fails the run if the user's folder got a key anyway (a subprocess given a bare env).
USER_LOCAL_KEY = (
    Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "attnforge" / "signing-key.pem"
)
_KEY_BEFORE = USER_LOCAL_KEY.exists()
_CONFIG_DIR = tempfile.mkdtemp(prefix="attnforge-test-config-")
os.environ["ATTNFORGE_CONFIG_DIR"] = _CONFIG_DIR
atexit.register(shutil.rmtree, _CONFIG_DIR, True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that created a signing key in the user's own configuration fails, naming the file."""
    if not _KEY_BEFORE and USER_LOCAL_KEY.exists():
        print(f"\nERROR: the test run created {USER_LOCAL_KEY}: tests must sign with their own keys")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
    """Slow real builds run only when allow-listed (noxfile.CI_SLOW_ALLOWLIST) or ATTNFORGE_RUN_ALL_SLOW=1.

    Docker tests skip with a reason when no engine answers, except in CI (.ci/run starts one: a missing
    engine there is a failure, not a skip). Drift tests (reproductions of upstream bugs, failing while the
    bug exists) run only when the marker expression names them (``-m drift``).
    """
    if "drift" not in (config.getoption("markexpr") or ""):
        skip_drift = pytest.mark.skip(reason="upstream reproduction: runs only with -m drift")
        for item in items:
            if "drift" in item.keywords:
                item.add_marker(skip_drift)
    allow = [a for a in os.environ.get("ATTNFORGE_SLOW_ALLOW", "").split(",") if a]
    if not os.environ.get("ATTNFORGE_RUN_ALL_SLOW"):
        skip_slow = pytest.mark.skip(
            reason="slow real build not in the CI allow-list (ATTNFORGE_RUN_ALL_SLOW=1 runs it)"
        )
        for item in items:
            if "slow" in item.keywords and not any(a in item.nodeid for a in allow):
                item.add_marker(skip_slow)
    if docker_available() or os.environ.get("CI"):
        return
    skip = pytest.mark.skip(reason="no Docker engine reachable (start dockerd; .ci/run does)")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)
