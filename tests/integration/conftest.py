"""An installed attnforge, as a team that runs `pipx install attnforge` has it: attnforge's own wheel (`pip wheel
--no-deps` of a copy of this checkout) installed with its `publish` extra into a fresh venv outside the checkout,
through this machine's pip configuration. Made once per session; its `attnforge` runs with no PYTHONPATH, so it
imports the installed copy, never the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class InstalledAttnforge:
    """The venv, the wheel it came from, and how to run its `attnforge`."""

    venv: Path
    wheel: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def cli(self) -> list[str]:
        return [str(self.venv / "bin" / "attnforge")]

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment without PYTHONPATH (which would put a source tree first)."""
        env = _clean_env()
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return {**env, **extra}

    def run(self, *args: str, cwd: Path, timeout: int = 2400, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.cli, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(**env),
            check=False,
        )


def _clean_env() -> dict[str, str]:
    """os.environ without PYTHONPATH: a source tree on it (PYTHONPATH=src) would count as an installed attnforge."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(cmd: list[str], cwd: Path | None = None, timeout: int = 900) -> None:
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=_clean_env()
    )
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="session")
def installed_attnforge(tmp_path_factory: pytest.TempPathFactory) -> InstalledAttnforge:
    tmp = tmp_path_factory.mktemp("installed-attnforge")
    # a copy of what the sdist holds, so the build writes nothing into the checkout (build/, *.egg-info)
    tree = tmp / "attnforge-src"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(tree)])
    (wheel,) = dist.glob("attnforge-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[publish]"], timeout=1800)
    return InstalledAttnforge(venv=venv, wheel=wheel)


@dataclass(frozen=True)
class DefaultBuild:
    """CI's one real build: `attnforge build --target default` into a private output and cache folder."""

    matrix: Path
    wheels: Path
    cache: Path
    output: str  # what the build printed


@pytest.fixture(scope="session")
def default_build(
    tmp_path_factory: pytest.TempPathFactory, installed_attnforge: InstalledAttnforge
) -> DefaultBuild:
    """Built once per session with the installed attnforge (test_build_default.py; its cache is reused by
    test_user_repo_ci.py, so a workflow's build step costs seconds)."""
    import yaml

    tmp = tmp_path_factory.mktemp("build-default")
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"]["output_dir"] = str(tmp / "wheels")
    data["build"]["cache_dir"] = str(tmp / "cache")
    matrix = tmp / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = installed_attnforge.run(
        "--matrix", str(matrix), "build", "--target", "default", cwd=tmp, timeout=2400, CI="1"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return DefaultBuild(matrix, tmp / "wheels", tmp / "cache", proc.stdout + proc.stderr)
