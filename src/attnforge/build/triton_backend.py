"""The triton backend: ROCm Triton-profile cells, built on the host with flash-attn's own setup.py.

Nothing is compiled (`attnforge.rocm.triton_wheel`): the build needs a Python with *some* torch, setuptools
and wheel, not the cell's ROCm torch, nor the cell's Python (the wheel is `py3-none-any`). The backend keeps
that Python as a venv in the cache (`<cache>/venvs/triton-build-cpXY`), installed once with this machine's
pip configuration. Its torch is a stand-in, `torch==2.13.0+cpu` unless $ATTNFORGE_TRITON_BUILD_TORCH names
another requirement (a CPU build: a CUDA torch would pull gigabytes of nvidia wheels for an import).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..cell import Cell
from ..errors import AttnforgeError, EnvironmentProblem
from ..rocm.triton_wheel import (
    TritonWheelInputs,
    TritonWheelResult,
    build_triton_wheel,
    make_build_python,
    python_facts,
)
from .engine import CellJob, file_digest
from .incontainer_api import EVENT_PREFIX, EXIT_COMPILE_ERROR, EXIT_ENVIRONMENT
from .progress import ProgressView

BUILD_TORCH_ENV = "ATTNFORGE_TRITON_BUILD_TORCH"
DEFAULT_BUILD_TORCH = "torch==2.13.0+cpu"
EXTRA_REQUIREMENTS: tuple[str, ...] = ("setuptools>=77", "wheel")
ROCM_DIR = Path(__file__).resolve().parents[1] / "rocm"
MARKER = ".attnforge-triton-build.json"


def build_requirements() -> list[str]:
    """What the build venv gets: the stand-in torch, setuptools and wheel."""
    return [os.environ.get(BUILD_TORCH_ENV) or DEFAULT_BUILD_TORCH, *EXTRA_REQUIREMENTS]


def ensure_build_python(venv: Path, requirements: list[str], log: Callable[[str], None]) -> Path:
    """The venv's python, created with `requirements` unless its marker says it already has them."""
    python = venv / "bin" / "python"
    marker = venv / MARKER
    venv.parent.mkdir(parents=True, exist_ok=True)
    with venv.with_name(venv.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if python.exists() and json.loads(marker.read_text()).get("requirements") == requirements:
                return python
        except (OSError, ValueError):
            pass
        if venv.exists():
            shutil.rmtree(venv)
        log(
            f"triton backend: creating {venv} (pip install {' '.join(requirements)}, this machine's pip config)"
        )
        start = time.monotonic()
        try:
            make_build_python(venv, requirements)
        except subprocess.CalledProcessError as exc:
            raise EnvironmentProblem(f"cannot create a venv at {venv}: {exc}") from None
        except EnvironmentProblem as exc:
            raise EnvironmentProblem(
                f"{exc.message}\nThe Triton build needs any torch that imports (a CPU build is enough): name one "
                f"that pip can install here with {BUILD_TORCH_ENV}, e.g. 'torch==2.9.1+cpu' with "
                "https://download.pytorch.org/whl/cpu in pip's configuration"
            ) from None
        facts = python_facts(str(python))
        marker.write_text(json.dumps({"requirements": requirements, "facts": facts}, indent=1))
        log(f"triton backend: build venv ready in {time.monotonic() - start:.0f} s (torch {facts['torch']})")
    return python


class TritonBackend:
    """Builds ROCm Triton-profile cells on the host; the engine still owns skip, logs, finalize and the move."""

    name = "triton"

    def __init__(self, cache: Path, requirements: list[str] | None = None) -> None:
        self.requirements = requirements or build_requirements()
        self.venv = cache / "venvs" / f"triton-build-cp{sys.version_info.major}{sys.version_info.minor}"
        self.pip_args: list[str] = []  # pip reads this machine's own configuration
        self.python: Path | None = None
        self._procs: dict[str, subprocess.Popen[str]] = {}
        self._lock = threading.Lock()

    def identity(self) -> str:
        """The venv's requirements and interpreter, and the builder's code (setup.py is the sdist's)."""
        return json.dumps(
            {
                "backend": self.name,
                "requirements": self.requirements,
                "python": f"{sys.version_info.major}.{sys.version_info.minor}",
                "builder": file_digest(ROCM_DIR / "triton_wheel.py", ROCM_DIR / "backends.py")[:16],
            },
            sort_keys=True,
        )

    def prepare(self, cells: list[Cell], view: ProgressView) -> None:
        for cell in cells:
            TritonWheelInputs.from_cell(cell)  # ConfigurationError for anything but a flash-attn Triton cell
        self.python = ensure_build_python(self.venv, self.requirements, view.log)
        view.log(f"triton backend: {len(cells)} cell(s) with {self.python} (no device code is compiled)")

    def run(self, job: CellJob, on_line: Callable[[str], None]) -> int:
        """Build the wheel into `<workdir>/out`, write `result.json` as incontainer.py does; exit code."""
        spec = job.spec
        out = Path(spec.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        result_path = out / "result.json"
        result_path.unlink(missing_ok=True)
        for old in out.glob("*.whl"):
            old.unlink()
        stage = {"event": "stage", "stage": "setup.py (Triton: nothing compiled)"}
        on_line(EVENT_PREFIX + json.dumps(stage))
        try:
            if self.python is None:
                raise EnvironmentProblem("the triton backend was not prepared (no build venv)")
            res = build_triton_wheel(
                Path(spec.sdist),
                TritonWheelInputs.from_cell(job.cell),
                out,
                python=str(self.python),
                work_dir=Path(spec.build_dir),
                source_date_epoch=spec.source_date_epoch,
                on_line=on_line,
                on_process=lambda proc: self._track(job, proc),
            )
        except AttnforgeError as exc:
            code = EXIT_ENVIRONMENT if isinstance(exc, EnvironmentProblem) else EXIT_COMPILE_ERROR
            lines = str(exc).splitlines()
            error = {"message": lines[0], "lines": lines[1:]}
            result_path.write_text(json.dumps({"ok": False, "error": error}, indent=1))
            on_line(f"attnforge: {exc}")
            return code
        finally:
            with self._lock:
                self._procs.pop(job.cell.id, None)
        result_path.write_text(json.dumps(self.result_json(job.cell, res), indent=1))
        # nothing to resume in a Triton build: keep build.log, drop the unpacked sdist (~110 MB)
        for tree in ("src", "dist"):
            shutil.rmtree(Path(spec.build_dir) / tree, ignore_errors=True)
        return 0

    @staticmethod
    def result_json(cell: Cell, res: TritonWheelResult) -> dict[str, Any]:
        """What the engine reads back (incontainer.py's result keys), plus the manifest's `rocm` block."""
        facts = res.build_torch
        return {
            "ok": True,
            "wheel": str(res.wheel),
            "wheel_name": res.wheel.name,
            "built_as": res.built_as,
            "sha256": res.sha256,
            "size": res.size,
            "wall_s": res.seconds,
            "image": None,
            "toolchain": {k: facts.get(k) for k in ("python", "torch", "setuptools", "wheel")},
            "peak_rss_gb": None,
            "units_total": 0,
            "units_compiled": 0,
            "units_reused": 0,
            "manifest": {"rocm": res.manifest_fields(cell.arches)},
        }

    def _track(self, job: CellJob, proc: subprocess.Popen[str]) -> None:
        with self._lock:
            self._procs[job.cell.id] = proc

    def cancel(self, job: CellJob) -> None:
        with self._lock:
            proc = self._procs.get(job.cell.id)
        if proc and proc.poll() is None:
            proc.terminate()
