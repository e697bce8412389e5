"""The manifest beside each wheel (`<wheel file>.manifest.json`, docs/contracts.md), read and written safely.

Manifests are shared: the build engine writes them, finalize completes them, the GPU parity run adds
`parity`. This module validates the keys it relies on and keeps every other key as it found it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import BuildError, PublishError

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


def sha256_file(path: Path) -> tuple[str, int]:
    """(hex sha256, size) of a file, streamed."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


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


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """Write beside the target and rename over it (readers see the old or the new file, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(path: Path, data: dict[str, Any]) -> None:
    """Validate and write atomically."""
    validate(data, str(path))
    atomic_write_bytes(path, dumps(data).encode("utf-8"))


def check_matches_wheel(wheel: Path, data: dict[str, Any]) -> str:
    """A publish-time check: the manifest names this file and its bytes; returns the sha256."""
    digest, size = sha256_file(wheel)
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
