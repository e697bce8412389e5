"""Names a finalized wheel carries (variant, local version, torch pin) and parsing them back.

The names come from `attnforge.matrix.cell.Cell` (one source of truth with the planner); this module builds a
Cell from a manifest's `inputs` and parses local versions back: `cu130torch2.14cxx11abiTRUE.infer` (one torch
release) and `cu130sm90atorch2.9abi3.fa3hd64128` (a stable-ABI wheel: toolkit, arches, torch floor).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from attnforge.builder.toolkits import cuda_of_variant
from attnforge.core.errors import BuildError
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.schema import ProfileSpec

PROJECT = "flash-attn"
TORCH_PROJECT = "torch"

# cu130 / rocm6.4, torch X.Y, cxx11abiTRUE|FALSE, optional .pt<build> (a custom torch build: its slug starts
# with the release's digits), optional .profiletag (compared case-insensitively: PEP 440 normalizes local
# segments to lower case, upstream spells TRUE/FALSE upper case).
LOCAL_RE = re.compile(
    r"^(?P<accel>cu\d{2,4}|rocm\d+\.\d+)torch(?P<torch>\d+\.\d+)cxx11abi(?P<abi>true|false)"
    r"(?:\.pt(?P<build>\d[a-z0-9]*))?(?:\.(?P<tag>[a-z][a-z0-9]*))?$",
    re.IGNORECASE,
)
# a stable-ABI wheel (cp310-abi3): toolkit, compiled arches, the oldest torch it serves
STABLE_LOCAL_RE = re.compile(
    r"^(?P<accel>cu\d{2,4})(?P<arches>(?:sm\d{2,3}[af]?)+)torch(?P<torch>\d+\.\d+)abi3"
    r"(?:\.(?P<tag>[a-z][a-z0-9]*))?$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class LocalParts:
    """The axes a local version names."""

    accel: str  # "cu130" | "rocm6.4"
    torch_family: str  # "2.14"; for a stable-ABI wheel the oldest torch it serves
    cxx11_abi: bool
    profile_tag: str | None
    torch_build: str | None = None  # the slug of a custom torch build (`.pt<slug>`), as `Cell.custom_torch`
    arches: tuple[str, ...] = ()  # a stable-ABI wheel's arches as the name spells them ("sm90a")
    stable_abi: bool = False

    @property
    def variant(self) -> str:
        if self.stable_abi:
            return f"{self.accel}-{'-'.join(self.arches)}-torch{self.torch_family}abi3"
        base = f"{self.accel}-torch{self.torch_family}"
        if self.torch_build:
            base += f"-pt{self.torch_build}"
        return base if self.cxx11_abi else f"{base}-cxx11abiFALSE"

    def torch_problem(self, torch_version: str) -> str | None:
        """Why a torch release cannot run this wheel (None when it can): another release family, or for a
        stable-ABI wheel one older than its floor."""
        have = torch_family(torch_version)
        if self.stable_abi:
            if Version(have) < Version(self.torch_family):
                return f"wheel needs torch >= {self.torch_family} (stable ABI), this is {torch_version}"
            return None
        return (
            None
            if have == self.torch_family
            else f"wheel needs torch {self.torch_family}.*, this is {torch_version}"
        )

    def accel_problem(self, accel: str) -> str | None:
        """Why torch's CUDA/ROCm build cannot run this wheel: another one; for a stable-ABI wheel another
        CUDA major or an older minor (CUDA minor-version compatibility covers newer ones)."""
        if accel == self.accel or (self.stable_abi and cuda_minor_compatible(accel, self.accel)):
            return None
        return f"wheel is {self.accel}, torch here is {accel}"


def cuda_minor_compatible(have: str, built: str) -> bool:
    """Whether torch's CUDA `have` (cu131) runs code built for `built` (cu130): same major, newer or same
    minor (NVIDIA's minor-version compatibility); False for ROCm or different majors."""
    h, b = cuda_of_variant(have), cuda_of_variant(built)
    if h is None or b is None:
        return False
    (h_major, h_minor), (b_major, b_minor) = h.split("."), b.split(".")
    return h_major == b_major and int(h_minor) >= int(b_minor)


def parse_local(local: str) -> LocalParts | None:
    """Parse `cu130torch2.14cxx11abiTRUE[.pt<build>][.tag]` or `cu130sm90atorch2.9abi3[.tag]`; None when not ours."""
    st = STABLE_LOCAL_RE.match(local)
    if st:
        return LocalParts(
            accel=st["accel"].lower(),
            torch_family=st["torch"],
            cxx11_abi=True,
            profile_tag=st["tag"].lower() if st["tag"] else None,
            arches=tuple(re.findall(r"sm\d{2,3}[af]?", st["arches"].lower())),
            stable_abi=True,
        )
    m = LOCAL_RE.match(local)
    if not m:
        return None
    return LocalParts(
        accel=m["accel"].lower(),
        torch_family=m["torch"],
        cxx11_abi=m["abi"].lower() == "true",
        profile_tag=m["tag"].lower() if m["tag"] else None,
        torch_build=m["build"].lower() if m["build"] else None,
    )


def torch_family(version: str) -> str:
    """`2.14.1+cu130` -> `2.14`."""
    return ".".join(version.split("+")[0].split(".")[:2])


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


def _profile_tag(inputs: dict[str, Any], manifest: dict[str, Any], built_local: str | None) -> str | None:
    """The profile's local-version tag (a profile's `tag` may differ from its name: inference -> infer).

    In order: `inputs.profile_tag`; the tag of the planned `local_version` in the manifest; the tag of
    the local version the build set (FLASH_ATTN_LOCAL_VERSION), when it names the same variant; the name.
    """
    profile = str(inputs.get("profile") or "full")
    if profile == "full" and not inputs.get("profile_tag"):
        return None
    if inputs.get("profile_tag"):
        return str(inputs["profile_tag"])
    for local in (manifest.get("local_version"), built_local):
        if isinstance(local, str) and (parts := parse_local(local)) and parts.profile_tag:
            return parts.profile_tag
    return profile


def cell_from_manifest(manifest: dict[str, Any], built_local: str | None = None) -> Cell:
    """The planner's Cell for the manifest's inputs (names derive from it, as in `attnforge plan`)."""
    inputs = manifest.get("inputs") or {}
    missing = [k for k in ("toolkit", "torch", "python", "cxx11_abi") if k not in inputs]
    if missing:
        raise BuildError(f"manifest inputs lack {', '.join(missing)}: cannot name the wheel")
    profile = str(inputs.get("profile") or "full")
    tag = _profile_tag(inputs, manifest, built_local)
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
    """Names for the manifest's cell; `kernel_version` must be set (`built_local`: see `_profile_tag`)."""
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
