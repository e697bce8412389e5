"""Names a finalized wheel carries (variant, local version, torch pin), from its manifest.

The names come from `attnforge.matrix.cell.Cell` (one source of truth with the planner), which has
`attnforge.names` make them; this module builds a Cell from a manifest's `inputs`. Parsing a local version
back (`parse_local`: `cu130torch2.14cxx11abiTRUE.infer`, `cu130sm90atorch2.9abi3.fa3hd64128`) is
`attnforge.names`'s, re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from attnforge.core.errors import BuildError
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.schema import ProfileSpec
from attnforge.names import LocalParts, cuda_minor_compatible, parse_local, profile_tag_of, torch_family

PROJECT = "flash-attn"
TORCH_PROJECT = "torch"

# the names themselves are made and parsed by attnforge.names; these are here for this module's readers
__all__ = [
    "PROJECT",
    "TORCH_PROJECT",
    "LocalParts",
    "WheelNames",
    "cell_from_manifest",
    "cuda_minor_compatible",
    "dist_name",
    "expected_names",
    "parse_local",
    "profile_tag_from_manifest",
    "torch_family",
    "torch_pin",
    "torch_requirement",
]


def torch_requirement(torch_version: str) -> str:
    """The pin a wheel carries: the exact release family it was compiled against (`torch==2.14.*`).

    The family, not the patch: libtorch keeps its C++ ABI within a minor release (upstream flash-attn
    names wheels by torch X.Y for that reason), and pinning the patch would make every torch patch
    release a rebuild. A different minor release is refused by pip's resolver (custom builds: `torch_pin`).
    """
    return f"{TORCH_PROJECT}=={torch_family(torch_version)}.*"


def torch_pin(cell: Cell) -> str:
    """The torch requirement of a cell's wheel: its release family (`torch_requirement`); `torch>=FLOOR` for a
    stable-ABI wheel; for a custom torch build (a nightly, NGC's `2.10.0a0+<sha>`) exactly that build: its C++
    ABI is promised by nothing else."""
    if cell.torch_floor:
        return f"{TORCH_PROJECT}>={cell.torch_floor}"
    if cell.custom_torch and cell.torch_build:
        return f"{TORCH_PROJECT}=={cell.torch_build}"
    return torch_requirement(cell.torch)


def dist_name(kernel: str) -> str:
    """The wheel file's distribution part: `flash-attn` -> `flash_attn`."""
    return canonicalize_name(kernel).replace("-", "_")


def profile_tag_from_manifest(manifest: dict[str, Any], built_local: str | None = None) -> str | None:
    """The profile's local-version tag (a profile's `tag` may differ from its name: inference -> infer).

    In order: `inputs.profile_tag` (written by every build since it was added; null for the full profile);
    for older manifests the tag of the planned `local_version` in the manifest, then of the local version the
    build set (FLASH_ATTN_LOCAL_VERSION); the name.
    """
    inputs = manifest.get("inputs") or {}
    profile = str(inputs.get("profile") or "full")
    if "profile_tag" in inputs:
        return str(inputs["profile_tag"]) if inputs["profile_tag"] else None
    if profile == "full":
        return None
    for local in (manifest.get("local_version"), built_local):
        if isinstance(local, str) and (tag := profile_tag_of(local)):
            return tag
    return profile


def cell_from_manifest(manifest: dict[str, Any], built_local: str | None = None) -> Cell:
    """The planner's Cell for the manifest's inputs (names derive from it, as in `attnforge plan`)."""
    inputs = manifest.get("inputs") or {}
    missing = [k for k in ("toolkit", "torch", "python", "cxx11_abi") if k not in inputs]
    if missing:
        raise BuildError(f"manifest inputs lack {', '.join(missing)}: cannot name the wheel")
    profile = str(inputs.get("profile") or "full")
    tag = profile_tag_from_manifest(manifest, built_local)
    rocm = manifest.get("rocm")
    backend = inputs.get("rocm_backend") or (rocm.get("rocm_backend") if isinstance(rocm, dict) else None)
    extra: dict[str, Any] = {"rocm_backend": backend} if backend else {}
    try:
        spec = (
            ProfileSpec(**extra)
            if tag is None
            else ProfileSpec(tag=tag, description="(from manifest)", **extra)
        )
    except ValueError as exc:
        what = f"profile tag {tag!r}" + (f", rocm_backend {backend!r}" if backend else "")
        raise BuildError(f"{what}: {exc}") from None
    if tag is not None and profile == "full":
        profile = tag
    return Cell(
        kernel=str(manifest.get("kernel") or PROJECT),
        kernel_version=str(manifest.get("kernel_version") or ""),
        toolkit=Toolkit.parse(str(inputs["toolkit"])),
        torch=str(inputs["torch"]).split("+")[0],
        python=str(inputs["python"]),
        cxx11_abi=bool(inputs["cxx11_abi"]),
        arches=tuple(str(a) for a in inputs.get("arches") or ()),
        profile=profile,
        platform=str(inputs.get("platform") or "x86_64"),
        torch_variant=inputs.get("torch_variant"),
        torch_build=inputs.get("torch_build"),
        torch_floor=inputs.get("torch_floor"),
        abi3_python=inputs.get("abi3_python"),
        profile_spec=spec,
    )


@dataclass(frozen=True)
class WheelNames:
    """What finalize makes a wheel say."""

    dist: str  # flash_attn
    version: str  # 2.8.3+cu130torch2.14cxx11abiTRUE
    local_version: str
    variant: str
    python_tag: str  # cp311 (cp310 for a stable-ABI wheel)
    torch_requirement: str  # torch==2.14.* (custom torch build: torch==<it>; stable ABI: torch>=2.9)
    platform: str  # x86_64
    pure_python: bool = False  # a ROCm Triton wheel: py3-none-any, nothing compiled
    abi_tag: str = ""  # cp311, or abi3 for a stable-ABI wheel (empty: the python tag)

    @property
    def wheel_tag(self) -> str:
        """The tag the wheel must carry before finalize (`cp311-cp311-linux_x86_64`,
        `cp310-abi3-linux_x86_64` or `py3-none-any`)."""
        if self.pure_python:
            return "py3-none-any"
        return f"{self.python_tag}-{self.abi_tag or self.python_tag}-linux_{self.platform}"


def expected_names(manifest: dict[str, Any], built_local: str | None = None) -> WheelNames:
    """Names for the manifest's cell; `kernel_version` must be set (`built_local`: see `profile_tag_from_manifest`)."""
    cell = cell_from_manifest(manifest, built_local)
    if not cell.kernel_version:
        raise BuildError("manifest has no kernel_version")
    return WheelNames(
        dist=dist_name(cell.kernel),
        version=f"{cell.kernel_version}+{cell.local_version}",
        local_version=cell.local_version,
        variant=cell.variant,
        python_tag=cell.py_tag,
        torch_requirement=torch_pin(cell),
        platform=cell.platform,
        pure_python=cell.pure_python,
        abi_tag="abi3" if cell.stable_abi else cell.cp,
    )
