"""The manifest beside each wheel (`<wheel file>.manifest.json`, docs/contracts.md): the one module that
makes, reads and writes it.

The build engine makes it (`engine.wheel_record.build_manifest`, with `manifest_inputs` of the cell), finalize completes it
(name, digest, platform tag), the GPU parity run adds `parity` (`record_parity`), publish checks it against
the wheel (`check_matches_wheel`). Reads validate the keys attnforge relies on; writes keep every other key
as found and replace the file atomically.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from attnforge.builder.files import atomic_write_bytes, sha256_file
from attnforge.core.errors import BuildError, PublishError
from attnforge.core.kernels import head_dims as kernel_head_dims
from attnforge.matrix.cell import Cell
from attnforge.wheels.parity_binding import load_report

MANIFEST_SUFFIX = ".manifest.json"
SCHEMA = 1


class Parity(BaseModel):
    """`parity` once a GPU parity run happened."""

    model_config = ConfigDict(extra="allow")

    passed: bool
    device: str | None = None
    report: str | None = None
    date: str | None = None


class PlatformTag(BaseModel):
    """The platform tag finalize chose and why."""

    model_config = ConfigDict(extra="allow")

    tag: str
    reason: str


class Inputs(BaseModel):
    """The cell's inputs (the keys finalize and the resolver read)."""

    model_config = ConfigDict(extra="allow")

    toolkit: str
    torch: str
    python: str
    cxx11_abi: bool
    torch_variant: str | None = None
    arches: list[str] = []
    profile: str = "full"
    profile_tag: str | None = None  # absent in manifests older than the field


class ManifestView(BaseModel):
    """Validation of a manifest's shape; the raw dict stays the thing that is written back."""

    model_config = ConfigDict(extra="allow")

    kernel: str = "flash-attn"
    kernel_version: str
    variant: str | None = None
    wheel: str | None = None
    sha256: str | None = None
    size: int | None = None
    inputs: Inputs
    platform_tag: PlatformTag | None = None
    parity: Parity | None = None


def manifest_path_for(wheel: Path) -> Path:
    """`dist/x.whl` -> `dist/x.whl.manifest.json`."""
    return wheel.with_name(wheel.name + MANIFEST_SUFFIX)


def validate(data: dict[str, Any], where: str) -> ManifestView:
    """Check the keys attnforge relies on; BuildError naming the first problem."""
    try:
        return ManifestView.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise BuildError(f"{where}: manifest {loc}: {err['msg']}") from None


def read_manifest(path: Path) -> dict[str, Any]:
    """Load and validate a manifest file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError(f"{path}: no manifest") from None
    except (OSError, ValueError) as exc:
        raise BuildError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(data, dict):
        raise BuildError(f"{path}: manifest is not a JSON object")
    validate(data, str(path))
    return data


def dumps(data: dict[str, Any]) -> str:
    """The on-disk form: 2-space JSON, key order kept, trailing newline."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def write_manifest(path: Path, data: dict[str, Any]) -> None:
    """Validate and write atomically."""
    validate(data, str(path))
    atomic_write_bytes(path, dumps(data).encode("utf-8"))


def check_matches_wheel(wheel: Path, data: dict[str, Any]) -> str:
    """A publish-time check: the manifest names this file and its bytes; returns the sha256."""
    digest, size = sha256_file(wheel), wheel.stat().st_size
    if data.get("wheel") != wheel.name:
        raise PublishError(
            f"{wheel.name}: its manifest names {data.get('wheel')!r}",
            hint="run `attnforge wheels finalize` on the wheel",
        )
    if data.get("sha256") != digest or data.get("size") != size:
        raise PublishError(
            f"{wheel.name}: bytes differ from its manifest (sha256 {digest[:12]}..., manifest "
            f"{str(data.get('sha256'))[:12]}...)",
            hint="the wheel changed after finalize; finalize it again",
        )
    return digest


# ---------------------------------------------------------------------------------------------- making one

BUILD_ONLY_INPUTS = ("source", "source_sha256", "patches")


def manifest_inputs(cell: Cell, *, for_image: bool = False) -> dict[str, Any]:
    """The manifest's `inputs` for a cell (one shape for wheel manifests and NGC image requests).

    for_image: a target cell's inputs as an NGC image sees them: no source or patches (the image builds
    upstream's sdist) and a head-dim list naming every head dim of the kernel reads as None (all).
    """
    head_dims = cell.profile_spec.head_dims
    inputs: dict[str, Any] = {
        "source": cell.source_kind,
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
        # the tag its names carry (null: none), so no reader parses it back out of the local version
        "profile_tag": cell.profile_tag,
    }
    if cell.torch_build:
        inputs["torch_build"] = cell.torch_build
    if cell.platform != "x86_64":  # the wheel's host architecture (absent: x86_64, as older manifests say)
        inputs["platform"] = cell.platform
    if cell.gencode:  # what the arch policy compiled (family targets, PTX): which GPUs the wheel runs on
        inputs["gencode"] = list(cell.gencode)
    if cell.stable_abi:  # one wheel for every torch >= torch_floor, Python >= abi3_python
        inputs["torch_floor"] = cell.torch_floor
        inputs["abi3_python"] = cell.abi3_python
    if for_image:
        for key in BUILD_ONLY_INPUTS:
            del inputs[key]
        inputs["head_dims"] = (
            head_dims if head_dims and set(head_dims) != set(kernel_head_dims(cell.kernel)) else None
        )
    return inputs


# ---------------------------------------------------------------------------------------------- parity


def record_parity(
    manifest: Path,
    passed: bool,
    device: str,
    report: str,
    date: str | None = None,
    driver: str | None = None,
) -> dict[str, Any]:
    """Set `parity: {passed, device, report, date}` (+ `driver`, the GPU driver's version, when known) in
    `manifest` (every other key kept); the new manifest."""
    data = read_manifest(manifest)
    data["parity"] = {
        "passed": bool(passed),
        "device": device,
        "report": report,
        "date": date or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if driver:
        data["parity"]["driver"] = driver
    write_manifest(manifest, data)
    return data


def record_from_report(manifest: Path, report_json: Path, report_ref: str | None = None) -> dict[str, Any]:
    """Record what a parity.json says: passed when it has no failure and at least one passed case."""
    rep = load_report(report_json)
    passed = int(rep.get("failed", 1)) == 0 and int(rep.get("passed", 0)) > 0
    return record_parity(manifest, passed, str(rep.get("device")), report_ref or str(report_json))
