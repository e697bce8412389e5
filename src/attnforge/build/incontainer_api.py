"""The host side of the builder contract: the spec `incontainer.py` reads, its exit codes and events."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cell import Cell
from .resources import Parallelism

EVENT_PREFIX = "@@attnforge "
# exit codes of incontainer.py (kept equal to its own constants; 137 = docker's --memory killed the builder)
EXIT_OK = 0
EXIT_BAD_SPEC = 2
EXIT_COMPILE_ERROR = 4
EXIT_ENVIRONMENT = 5
EXIT_IMPORT = 6
EXIT_OOM = 75
EXIT_CONTAINER_KILLED = 137
SOURCE_DATE_EPOCH = 1700000000  # fixed: the same inputs give the same wheel bytes


@dataclass(frozen=True)
class BuildSpec:
    """One cell's build, as the builder script sees it (paths are the builder's own)."""

    cell_id: str
    kernel_set_key: str
    kernel: str
    kernel_version: str
    sdist: str
    sdist_sha256: str
    python: str
    torch: str
    torch_variant: str
    cxx11_abi: bool
    cuda_archs: list[str]
    local_version: str
    max_jobs: int
    nvcc_threads: int
    disable: list[str]
    head_dims: list[int] | None
    dtypes: list[str] | None
    patches: list[str]
    build_dir: str
    objects_dir: str
    ccache_dir: str
    out_dir: str
    venv_dir: str
    pip_args: list[str] = field(default_factory=list)
    rocm_backend: str | None = None
    source_date_epoch: int = SOURCE_DATE_EPOCH

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_max_jobs(self, jobs: int) -> BuildSpec:
        return dataclasses.replace(self, max_jobs=jobs)

    def map_paths(self, mapper: Callable[[str], str]) -> BuildSpec:
        """The same spec with host paths rewritten for a container."""
        return dataclasses.replace(
            self,
            sdist=mapper(self.sdist),
            build_dir=mapper(self.build_dir),
            objects_dir=mapper(self.objects_dir),
            ccache_dir=mapper(self.ccache_dir),
            out_dir=mapper(self.out_dir),
            venv_dir=mapper(self.venv_dir),
        )


def cuda_arch_list(arches: tuple[str, ...]) -> list[str]:
    """sm_90 -> 90, sm_90a -> 90a; gfx arches as they are (GPU_ARCHS for ROCm)."""
    return [a[3:] if a.startswith("sm_") else a for a in arches]


def make_spec(
    cell: Cell,
    *,
    sdist: Path,
    workdir: Path,
    objects_dir: Path,
    ccache_dir: Path,
    parallelism: Parallelism,
    pip_args: list[str] | None = None,
    venv_root: Path | None = None,
) -> BuildSpec:
    """The spec for one cell, with host paths (a container backend maps them)."""
    assert cell.source_sha256 is not None
    venvs = venv_root or workdir.parent.parent.parent / "venvs"
    return BuildSpec(
        cell_id=cell.id,
        kernel_set_key=cell.kernel_set_key,
        kernel=cell.kernel,
        kernel_version=cell.kernel_version,
        sdist=str(sdist),
        sdist_sha256=cell.source_sha256,
        python=cell.python,
        torch=cell.torch,
        torch_variant=cell.torch_variant or "",
        cxx11_abi=cell.cxx11_abi,
        cuda_archs=cuda_arch_list(cell.arches),
        local_version=cell.local_version,
        max_jobs=parallelism.max_jobs,
        nvcc_threads=parallelism.nvcc_threads,
        disable=[d.upper() for d in cell.profile_spec.disable],
        head_dims=cell.profile_spec.head_dims,
        dtypes=list(cell.profile_spec.dtypes) if cell.profile_spec.dtypes else None,
        patches=list(cell.patches),
        build_dir=str(workdir / "tree"),
        objects_dir=str(objects_dir),
        ccache_dir=str(ccache_dir),
        out_dir=str(workdir / "out"),
        venv_dir=str(venvs / f"{cell.cp}-torch{cell.torch}-{cell.torch_variant}"),
        pip_args=list(pip_args or []),
        rocm_backend=cell.profile_spec.rocm_backend,
        source_date_epoch=int(os.environ.get("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)),
    )
