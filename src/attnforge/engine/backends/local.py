"""The local backend: the builder on this machine's toolchain, torch in a cached venv (developers)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from attnforge.core.errors import EnvironmentProblem
from attnforge.engine.jobs import CellJob
from attnforge.engine.progress import ProgressView
from attnforge.matrix.cell import Cell

BUILDER = ["-m", "attnforge.builder"]


def find_nvcc() -> Path | None:
    """nvcc of a whole toolkit (`bin/nvcc` beside `include/cuda_runtime.h`): $CUDA_HOME's, /usr/local/cuda's,
    then the one on PATH (followed through symlinks). A wrapper script on PATH (`exec .../nvcc "$@"`) is not
    a toolkit root: its folder would make CUDA_HOME point where no CUDA header is."""
    on_path = shutil.which("nvcc")
    for candidate in (
        Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc" if os.environ.get("CUDA_HOME") else None,
        Path("/usr/local/cuda/bin/nvcc"),
        Path(on_path).resolve() if on_path else None,
    ):
        if (
            candidate
            and candidate.is_file()
            and (candidate.parent.parent / "include" / "cuda_runtime.h").is_file()
        ):
            return candidate
    return None


def tool_version(cmd: list[str]) -> str:
    """The last line a `--version` command prints, or "unavailable"."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    return out.strip().splitlines()[-1] if out.strip() else "unavailable"


class LocalBackend:
    """Runs the builder with the host's Python interpreters and CUDA toolkit."""

    name = "local"

    def __init__(self, pip_args: list[str] | None = None) -> None:
        self.pip_args = pip_args or []  # empty: pip inside the build reads this machine's own config
        self.interpreter: str | None = None  # the env backend's: build with this Python's own torch
        self._procs: dict[str, subprocess.Popen[str]] = {}

    def identity(self) -> str:
        nvcc = find_nvcc()
        return json.dumps(
            {
                "backend": "local",
                "nvcc": tool_version([str(nvcc), "--version"]) if nvcc else None,
                "gcc": tool_version(["gcc", "-dumpfullversion"]),
            },
            sort_keys=True,
        )

    def prepare(self, cells: list[Cell], view: ProgressView) -> None:
        if any(c.toolkit.kind == "cuda" for c in cells) and find_nvcc() is None:
            raise EnvironmentProblem(
                "no CUDA toolkit found for the local backend (no nvcc in $CUDA_HOME/bin, PATH or /usr/local/cuda): "
                "install one or use --backend docker"
            )
        for py in sorted({c.python for c in cells if not c.pure_python}):  # Triton builds use this Python
            if shutil.which(f"python{py}") is None:
                raise EnvironmentProblem(
                    f"python{py} is not on PATH: the local backend needs each cell's Python"
                )
        view.log(f"local backend: nvcc at {find_nvcc()}, builder {sys.executable} {' '.join(BUILDER)}")

    def run(self, job: CellJob, on_line: Callable[[str], None]) -> int:
        env = dict(os.environ)
        nvcc = find_nvcc()
        if nvcc and "CUDA_HOME" not in env:
            env["CUDA_HOME"] = str(nvcc.parent.parent)
        env["PYTHONUNBUFFERED"] = "1"
        proc = subprocess.Popen(
            [sys.executable, *BUILDER, "--spec", str(job.spec_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=env,
            start_new_session=True,
        )
        self._procs[job.cell.id] = proc
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line)
        code = proc.wait()
        self._procs.pop(job.cell.id, None)
        return code

    def cancel(self, job: CellJob) -> None:
        proc = self._procs.get(job.cell.id)
        if proc and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
