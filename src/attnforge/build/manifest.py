"""The manifest written beside every wheel (schema in docs/contracts.md), and the hand-off to finalize."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cell import Cell
from .sources import sha256_of

if TYPE_CHECKING:
    from .engine import CellJob

MANIFEST_SCHEMA = 1
FULL_HEAD_DIMS = frozenset({32, 64, 96, 128, 192, 256})
BUILD_ONLY_INPUTS = ("source", "source_sha256", "patches")


def manifest_inputs(cell: Cell, *, for_image: bool = False) -> dict[str, Any]:
    """The manifest's `inputs` for a cell (one shape for wheel manifests and NGC image requests).

    for_image: a target cell's inputs as an NGC image sees them: no source or patches (the image builds
    upstream's sdist) and a head-dim list naming every head dim reads as None (all).
    """
    head_dims = cell.profile_spec.head_dims
    inputs: dict[str, Any] = {
        "source": "pypi-sdist",
        "source_sha256": cell.source_sha256,
        "toolkit": str(cell.toolkit),
        "torch": cell.torch,
        "torch_variant": cell.torch_variant,
        "python": cell.python,
        "cxx11_abi": cell.cxx11_abi,
        "arches": list(cell.arches),
        "profile": cell.profile,
        "profile_flags": cell.compile_flags(),
        "head_dims": head_dims,
        "dtypes": cell.profile_spec.dtypes,
        "patches": list(cell.patches),
    }
    if for_image:
        for key in BUILD_ONLY_INPUTS:
            del inputs[key]
        inputs["head_dims"] = head_dims if head_dims and set(head_dims) != FULL_HEAD_DIMS else None
    return inputs


def build_manifest(
    cell: Cell,
    wheel: Path,
    result: dict[str, Any],
    job: CellJob,
    backend: str,
    seconds: float,
) -> dict[str, Any]:
    """Inputs, toolchain and build facts; `wheels finalize` adds the final name, digest and platform tag."""
    spec = job.spec
    return {
        "schema": MANIFEST_SCHEMA,
        "cell_id": cell.id,
        "variant": cell.variant,
        "local_version": cell.local_version,
        "kernel": cell.kernel,
        "kernel_version": cell.kernel_version,
        "wheel": wheel.name,
        "sha256": sha256_of(wheel),
        "size": wheel.stat().st_size,
        "inputs": manifest_inputs(cell),
        "kernel_set_key": cell.kernel_set_key,
        "input_hash": job.input_hash,
        "toolchain": result.get("toolchain", {}),
        "build": {
            "backend": backend,
            "image": result.get("image"),
            "started": (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds)).isoformat(),
            "wall_s": round(seconds, 1),
            "builder_wall_s": result.get("wall_s"),
            "max_jobs": spec.max_jobs,
            "nvcc_threads": spec.nvcc_threads,
            "peak_rss_gb": result.get("peak_rss_gb"),
            "units_total": result.get("units_total"),
            "units_compiled": result.get("units_compiled"),
            "units_reused": result.get("units_reused"),
            "oom_retries": result.get("oom_retries", 0),
            "jobs_before": result.get("jobs_before"),
            "jobs_after": result.get("jobs_after"),
        },
        "platform_tag": None,
        "parity": None,
    }
