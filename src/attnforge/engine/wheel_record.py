"""The manifest of a freshly built wheel: the cell's inputs, the toolchain and the build's own facts
(backend, image, wall time, MAX_JOBS, units compiled and reused). Finalize completes it (`wheels.finalize`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from attnforge.builder.files import sha256_file
from attnforge.engine.jobs import CellJob
from attnforge.engine.rocm.build_plan import plan_rocm_build
from attnforge.matrix.cell import Cell
from attnforge.wheels.manifest import SCHEMA, manifest_inputs


def build_manifest(
    cell: Cell, wheel: Path, result: dict[str, Any], job: CellJob, backend: str, seconds: float
) -> dict[str, Any]:
    """Inputs, toolchain and build facts; finalize adds the final name, digest and platform tag."""
    spec = job.spec
    manifest: dict[str, Any] = {
        "schema": SCHEMA,
        "cell_id": cell.id,
        "variant": cell.variant,
        "local_version": cell.local_version,
        "kernel": cell.kernel,
        "kernel_version": cell.kernel_version,
        "wheel": wheel.name,
        "sha256": sha256_file(wheel),
        "size": wheel.stat().st_size,
        "inputs": manifest_inputs(cell),
        "kernel_set_key": cell.kernel_set_key,
        "input_hash": job.input_hash,
        "toolchain": result.get("toolchain", {}),
        "build": {
            "backend": backend,
            "image": result.get("image"),
            "image_id": result.get("image_id"),
            "base": result.get("base"),
            "host_compiler": result.get("host_compiler"),
            "patches_applied": result.get("patches_applied"),
            "torch_build": result.get("torch_build"),
            # the glibc-floor object linked in, and the tags of the torch wheel the floor is read from
            "glibc_floor": result.get("glibc_floor"),
            # made earlier: by the host while the images built, or by a prior build
            "venv_reused": result.get("venv_reused"),
            "started": (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds)).isoformat(),
            "wall_s": round(seconds, 1),
            "builder_wall_s": result.get("wall_s"),
            "max_jobs": spec.max_jobs,
            "nvcc_threads": spec.nvcc_threads,
            "peak_rss_gb": result.get("peak_rss_gb"),
            "units_total": result.get("units_total"),
            "units_compiled": result.get("units_compiled"),
            "units_reused": result.get("units_reused"),
            "cores": result.get("cores"),
            "compile_s": (result.get("stages") or {}).get("compile"),
            "kernel_objects_reused": (result.get("kernel_objects") or {}).get("reused"),
            "unit_times": result.get("unit_times") or {},
            "stage_windows": result.get("stage_windows") or {},
            "kernel_lane": {
                k: (result.get("kernel_lane") or {}).get(k) for k in ("jobs", "linked", "mismatch")
            }
            if result.get("kernel_lane")
            else None,
            "exceptions_recheck": (result.get("import_check") or {}).get("exceptions"),
            "oom_retries": result.get("oom_retries", 0),
            "jobs_before": result.get("jobs_before"),
            "jobs_after": result.get("jobs_after"),
        },
        "platform_tag": None,
        "parity": None,
    }
    if result.get("vendored"):  # what the source vendors (CUTLASS: version, tree hash, commit where known)
        manifest["vendored"] = result["vendored"]
    if cell.toolkit.kind == "rocm":  # the ROCm backend names the wheel's tag (py3-none-any for Triton)
        plan = plan_rocm_build(cell, settings=job.settings)  # the build's own, not a second resolution
        manifest["inputs"]["rocm_backend"] = plan.backend
        manifest["rocm"] = {
            **plan.manifest_fields(),
            "build_torch": result.get("torch_build"),
            "import_env": dict(plan.import_env),
        }
    return manifest
