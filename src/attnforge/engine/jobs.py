"""One cell's job: the builder spec made from a cell (host paths), the backend protocol that runs it, and
the input hash that tells an unchanged wheel."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from attnforge import __version__
from attnforge.builder.cross import host_machine
from attnforge.builder.settings import BuildSettings
from attnforge.builder.spec import BuildSpec, Source
from attnforge.core.kernels import import_names
from attnforge.core.pins import cpu_torch
from attnforge.engine.progress import ProgressView
from attnforge.matrix.cell import Cell

BUILDER_DIR = Path(__file__).resolve().parents[1] / "builder"
SOURCE_DATE_EPOCH = 1700000000  # fixed: the same inputs give the same wheel bytes
TRITON_BUILD_TORCH_ENV = "ATTNFORGE_TRITON_BUILD_TORCH"  # another torch requirement for Triton builds


@dataclass
class CellJob:
    """Everything one cell's build needs, with host paths."""

    cell: Cell
    spec: BuildSpec
    workdir: Path  # cache/cells/<key>/<cpXY-torchT>: build tree (kept for resume), out/, spec.json
    log_path: Path
    settings: BuildSettings  # resolved once (`engine.settings`); an OOM resume adjusts it
    input_hash: str
    memory_limit_gb: float | None = None  # --memory-limit: the container's hard cap (no swap)

    @property
    def spec_path(self) -> Path:
        return self.workdir / "spec.json"


class Backend(Protocol):
    """Runs one cell's spec; returns the builder's exit code. Lines go to `on_line` as they come."""

    name: str
    pip_args: list[str]
    interpreter: str | None  # build with this Python's own torch (env backend), else None

    def identity(self) -> str:
        """What, besides the cell, decides the wheel bytes (image digest, host toolchain)."""

    def prepare(self, cells: list[Cell], view: ProgressView) -> None:
        """Make images/venvs the cells need (once per build)."""

    def run(self, job: CellJob, on_line: Callable[[str], None]) -> int:
        """Run the builder for `job` and return its exit code."""

    def cancel(self, job: CellJob) -> None:
        """Stop a running job (Ctrl-C)."""


def make_spec(
    cell: Cell,
    *,
    source: Source,
    workdir: Path,
    objects_dir: Path,
    ccache_dir: Path,
    settings: BuildSettings,
    pip_args: list[str] | None = None,
    venv_root: Path | None = None,
    interpreter: str | None = None,
    max_gcc: int | None = None,
) -> BuildSpec:
    """The builder's spec for one cell, with host paths (the docker backend mounts them at the same paths).

    `interpreter`: build with that Python and the torch installed there (the env backend). A ROCm Triton
    cell compiles nothing: it builds with this machine's Python and a CPU stand-in torch (its wheel is
    `py3-none-any`; setup.py only imports torch). `max_gcc`: the newest gcc major the cell's CUDA toolkit
    accepts (the builder picks a `g++-N` at or below it when the default g++ is newer).
    """
    venvs = venv_root or workdir.parent.parent.parent / "venvs"
    profile = cell.profile_spec
    spec = BuildSpec(
        cell_id=cell.id,
        kernel=cell.kernel,
        kernel_version=cell.kernel_version,
        source=source,
        python=cell.python,
        torch=cell.torch,
        torch_variant=cell.torch_variant,
        build_dir=str(workdir / "tree"),
        venv_dir=str(venvs / f"{cell.cp}-torch{cell.torch}-{cell.torch_variant}"),
        output_dir=str(workdir / "out"),
        kernel_objects_dir=str(objects_dir),
        kernel_set_key=cell.kernel_set_key,
        local_version=cell.local_version,
        arches=list(cell.arches),
        cxx11_abi=cell.cxx11_abi,
        patches=list(cell.patches),
        disable=list(profile.disable),
        head_dims=profile.head_dims,
        dtypes=list(profile.dtypes) if profile.dtypes else None,
        profile=cell.profile_tag or "full",
        rocm_backend=profile.rocm_backend,
        import_names=import_names(cell.kernel),
        stable_abi=cell.stable_abi,
        ccache_dir=str(ccache_dir),
        pip_args=list(pip_args or []),
        source_date_epoch=int(os.environ.get("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)),
        max_gcc=max_gcc,
        gencode=list(cell.gencode),
        platform=cell.platform,
    ).with_settings(settings)
    if cell.platform != host_machine() and not cell.pure_python:
        # cross-compiled (builder/cross.py): nothing built for the target runs here, so neither the compiler
        # probe nor the import check can; an arm64 runner (or an emulator) imports the wheel
        spec = spec.replace(cxx_probe=False, import_check=False)
    if interpreter is not None:
        return spec.replace(python=interpreter, use_interpreter=True, torch=cell.torch_build or cell.torch)
    if cell.pure_python:
        requirement = os.environ.get(TRITON_BUILD_TORCH_ENV) or cpu_torch()
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        return spec.replace(
            python=py,
            torch=requirement.split("==")[-1].split("+")[0],
            torch_requirement=requirement,
            torch_variant=None,
            venv_dir=str(venvs / f"triton-build-cp{py.replace('.', '')}"),
            extra_requirements=["setuptools>=77", "wheel"],
            import_check=False,
        )
    return spec


def file_digest(*paths: Path) -> str:
    """sha256 over files and folders (relative names and bytes; __pycache__ left out)."""
    h = hashlib.sha256()
    for p in sorted(paths):
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts:
                    h.update(f.relative_to(p).as_posix().encode())
                    h.update(f.read_bytes())
        elif p.exists():
            h.update(p.read_bytes())
    return h.hexdigest()


def input_hash(cell: Cell, backend_identity: str) -> str:
    """Everything that decides a wheel's bytes; an unchanged hash means an unchanged wheel."""
    blob = json.dumps(
        {
            "kernel_set_key": cell.kernel_set_key,
            "python": cell.python,
            "torch": [cell.torch, cell.torch_variant, cell.torch_build],  # the key may leave torch out
            "patches": list(cell.patches),
            "backend": backend_identity,
            "builder": file_digest(BUILDER_DIR),
            "attnforge": __version__,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]
