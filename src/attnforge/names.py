"""Every name a wheel and its image carry, made and parsed here only: toolkit spellings ("cuda13.0", "cu130",
"rocm6.4"), the variant (an index and image family), the local version of each kernel family (FA2 per torch
and stable ABI, FA3, ROCm, FA4's and Flex's kernel wheels), the profile tag and the image tag.

Standard library only: FA4 on bare GPU hosts and parity's profile reader use it. The CUDA/ROCm version <->
PyTorch variant spellings live in `builder/toolkits.py` (the builder runs alone inside build containers and
cannot import this module); they are re-exported here, and the host imports them from here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnforge.builder.toolkits import (
    cuda_of_variant,
    cuda_variant,
    rocm_variant,
    toolkit_of_variant,
    toolkit_variant,
)

__all__ = [
    "ALIAS_SUFFIX",
    "Fa4Local",
    "FlexLocal",
    "LocalParts",
    "cuda_minor_compatible",
    "cuda_of_variant",
    "cuda_variant",
    "cuda_version",
    "custom_torch_slug",
    "fa4_local",
    "flex_local",
    "image_family",
    "image_tag",
    "parse_fa4_local",
    "parse_flex_local",
    "parse_image_tag",
    "parse_local",
    "parse_toolkit",
    "parse_version",
    "profile_tag",
    "profile_tag_of",
    "rocm_variant",
    "split_toolkit",
    "toolkit_of_variant",
    "toolkit_variant",
    "torch_family",
]

# ------------------------------------------------------------------------------------------- toolkits


def parse_toolkit(toolkit: str) -> tuple[str, str] | None:
    """A matrix toolkit's kind and version: "cuda13.0" -> ("cuda", "13.0"), "rocm6.4" -> ("rocm", "6.4");
    None for anything else."""
    for kind in ("cuda", "rocm"):
        if toolkit.startswith(kind):
            return kind, toolkit.removeprefix(kind)
    return None


def split_toolkit(toolkit: str) -> tuple[str, str]:
    """`parse_toolkit`, reading anything that is not CUDA as ROCm (the matrix schema allows only these two)."""
    return parse_toolkit(toolkit) or ("rocm", toolkit[len("rocm") :])


def cuda_version(toolkit: str) -> str | None:
    """The CUDA version of a matrix toolkit ("cuda13.0" -> "13.0"); None for a ROCm or unknown toolkit."""
    kind, version = parse_toolkit(toolkit) or ("", "")
    return version if kind == "cuda" else None


def torch_family(version: str) -> str:
    """`2.14.1+cu130` -> `2.14`."""
    return ".".join(version.split("+")[0].split(".")[:2])


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def cuda_minor_compatible(have: str, built: str) -> bool:
    """Whether torch's CUDA `have` (cu131) runs code built for `built` (cu130): same major, newer or same
    minor (NVIDIA's minor-version compatibility); False for ROCm or different majors."""
    h, b = cuda_of_variant(have), cuda_of_variant(built)
    if h is None or b is None:
        return False
    (h_major, h_minor), (b_major, b_minor) = h.split("."), b.split(".")
    return h_major == b_major and int(h_minor) >= int(b_minor)


# ------------------------------------------------------------------------- custom torch and profile tag

_RELEASE_LOCAL_RE = re.compile(r"^(cu\d{2,4}|rocm\d+(\.\d+)*|cpu)$")


def custom_torch_slug(version: str) -> str | None:
    """None for a release wheel's version (`2.11.0`, `2.11.0+cu130`); else its letters and digits, lower
    case (`2.10.0a0+5a8cd0ef.nv25.06` -> `2100a05a8cd0efnv2506`): a pre/dev release or a local build."""
    release, _, local = version.partition("+")
    if re.fullmatch(r"\d+\.\d+(\.\d+)?", release) and (not local or _RELEASE_LOCAL_RE.match(local)):
        return None
    return re.sub(r"[^a-z0-9]", "", version.lower())


def profile_tag(profile: str, tag: str | None, full: bool) -> str | None:
    """A profile's local-version tag: none for the full profile (named `full` and compiling everything),
    else the profile's `tag`, else its name (inference -> `infer` only where the profile says so)."""
    if profile == "full" and full:
        return None
    return tag or profile


# ------------------------------------------------------------------------------ FA2 / FA3 / ROCm wheels

# cu130 / rocm6.4, torch X.Y, cxx11abiTRUE|FALSE, optional .pt<build> (a custom torch build: its slug starts
# with the release's digits), optional .profiletag (compared case-insensitively: PEP 440 normalizes local
# segments to lower case, upstream spells TRUE/FALSE upper case).
_LOCAL_RE = re.compile(
    r"^(?P<accel>cu\d{2,4}|rocm\d+\.\d+)torch(?P<torch>\d+\.\d+)cxx11abi(?P<abi>true|false)"
    r"(?:\.pt(?P<build>\d[a-z0-9]*))?(?:\.(?P<tag>[a-z][a-z0-9]*))?$",
    re.IGNORECASE,
)
# a stable-ABI wheel (cp310-abi3): toolkit, compiled arches (FA2's and FA3's), the oldest torch it serves
_STABLE_LOCAL_RE = re.compile(
    r"^(?P<accel>cu\d{2,4})(?P<arches>(?:sm\d{2,3}[af]?)*)torch(?P<torch>\d+\.\d+)abi3"
    r"(?:\.(?P<tag>[a-z][a-z0-9]*))?$",
    re.IGNORECASE,
)
_ARCH_RE = re.compile(r"sm\d{2,3}[af]?")


@dataclass(frozen=True)
class LocalParts:
    """The axes a flash-attn (FA2, FA3, ROCm) local version names; renders the variant and the local version
    and parses back (`parse_local`). A stable-ABI wheel's name carries no C++ ABI: it reads as cxx11_abi."""

    accel: str  # "cu130" | "rocm6.4"
    torch_family: str  # "2.14"; for a stable-ABI wheel the oldest torch it serves
    cxx11_abi: bool
    profile_tag: str | None
    torch_build: str | None = None  # the slug of a custom torch build (`.pt<slug>`), as `Cell.custom_torch`
    arches: tuple[str, ...] = ()  # a stable-ABI wheel's arches as the name spells them ("sm90a")
    stable_abi: bool = False

    @property
    def variant(self) -> str:
        """Index/image family name: cu128-torch2.8 (+ -pt<build>, + -cxx11abiFALSE for the old ABI); a
        stable-ABI wheel names its toolkit, arches and torch floor instead: cu130-sm90a-torch2.9abi3."""
        if self.stable_abi:
            return "-".join([self.accel, *self.arches, f"torch{self.torch_family}abi3"])
        base = f"{self.accel}-torch{self.torch_family}"
        if self.torch_build:
            base += f"-pt{self.torch_build}"
        return base if self.cxx11_abi else f"{base}-cxx11abiFALSE"

    @property
    def local_version(self) -> str:
        """Upstream's habit (cu128torch2.8cxx11abiTRUE), `.pt<build>` for a custom torch build, then the
        profile tag when not full. A stable-ABI wheel: cu130sm90atorch2.9abi3[.tag] (toolkit, arches, floor)."""
        if self.stable_abi:
            local = f"{self.accel}{''.join(self.arches)}torch{self.torch_family}abi3"
        else:
            abi = "TRUE" if self.cxx11_abi else "FALSE"
            local = f"{self.accel}torch{self.torch_family}cxx11abi{abi}"
            if self.torch_build:
                local += f".pt{self.torch_build}"
        return f"{local}.{self.profile_tag}" if self.profile_tag else local

    def torch_problem(self, torch_version: str) -> str | None:
        """Why a torch release cannot run this wheel (None when it can): another release family, or for a
        stable-ABI wheel one older than its floor."""
        have = torch_family(torch_version)
        if self.stable_abi:
            if _version_tuple(have) < _version_tuple(self.torch_family):
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


def parse_local(local: str) -> LocalParts | None:
    """Parse `cu130torch2.14cxx11abiTRUE[.pt<build>][.tag]` or `cu130sm90atorch2.9abi3[.tag]`; None when
    not a flash-attn local version of attnforge's (or upstream's) making."""
    st = _STABLE_LOCAL_RE.match(local)
    if st:
        return LocalParts(
            accel=st["accel"].lower(),
            torch_family=st["torch"],
            cxx11_abi=True,
            profile_tag=st["tag"].lower() if st["tag"] else None,
            arches=tuple(_ARCH_RE.findall(st["arches"].lower())),
            stable_abi=True,
        )
    m = _LOCAL_RE.match(local)
    if not m:
        return None
    return LocalParts(
        accel=m["accel"].lower(),
        torch_family=m["torch"],
        cxx11_abi=m["abi"].lower() == "true",
        profile_tag=m["tag"].lower() if m["tag"] else None,
        torch_build=m["build"].lower() if m["build"] else None,
    )


def parse_version(version: str) -> LocalParts | None:
    """`2.8.3+cu130torch2.14cxx11abiTRUE.hd128` -> its local version's parts; None without one of ours."""
    _, plus, local = version.partition("+")
    return parse_local(local) if plus else None


def profile_tag_of(local: str) -> str | None:
    """The profile tag a local version carries (None: the full profile, or not a local version of ours).
    For names whose manifest predates `inputs.profile_tag`: newer readers take the manifest's field."""
    parts = parse_local(local)
    return parts.profile_tag if parts else None


# -------------------------------------------------------------------------------------- FA4 kernel wheels

_FA4_LOCAL_RE = re.compile(r"^fa4v(?P<fa4>[a-z0-9.]+?)\.cu(?P<major>\d+)\.sm(?P<arch>\d+)$")


@dataclass(frozen=True)
class Fa4Local:
    """The axes of an FA4 kernel wheel's local version: the FA4 release, the CUDA major, the GPU arch."""

    fa4_version: str  # "4.0.0b36", as the name spells it (lower case, letters, digits and dots)
    cuda_major: int
    arch: int  # 90

    @property
    def local_version(self) -> str:
        """``fa4v4.0.0b36.cu13.sm90`` (also the FA4 cell's variant)."""
        return f"fa4v{self.fa4_version}.cu{self.cuda_major}.sm{self.arch}"


def fa4_local(fa4_version: str, cuda_major: int | str, arch: int | str) -> Fa4Local:
    """An FA4 kernel wheel's local-version parts (the FA4 release as a PEP 440 local segment spells it)."""
    return Fa4Local(re.sub(r"[^a-z0-9.]", "", fa4_version.lower()), int(cuda_major), int(arch))


def parse_fa4_local(local: str) -> Fa4Local | None:
    """``fa4v4.0.0b36.cu13.sm90`` -> its parts; None for another name."""
    m = _FA4_LOCAL_RE.match(local.lower())
    return Fa4Local(m["fa4"], int(m["major"]), int(m["arch"])) if m else None


# ------------------------------------------------------------------------------------- Flex kernel wheels

_FLEX_LOCAL_RE = re.compile(
    r"^(?:(?P<family>[a-z0-9]+)\.)?torch(?P<torch>\d+\.\d+)\.(?:(?P<cuda>cu\d{2,4})\.(?P<sm>sm\d+)|cpu\.(?P<cpu>[a-z0-9]+))$"
)


@dataclass(frozen=True)
class FlexLocal:
    """The axes of a Flex kernel wheel's local version: its family (None: the default one), torch, and the
    device its kernels were compiled for (`cu130` + `sm90`, or `cpu` + the CPU capability)."""

    torch_family: str  # "2.11"
    accel: str  # "cu130" | "cpu"
    target: str  # "sm90" | "avx512"
    family: str | None = None

    @property
    def local_version(self) -> str:
        """``[family.]torch2.11.cu130.sm90`` / ``torch2.13.cpu.avx512``."""
        local = f"torch{self.torch_family}.{self.accel}.{self.target}"
        return f"{self.family}.{local}" if self.family else local


def flex_local(keys: Mapping[str, Any], family: str = "default") -> FlexLocal:
    """A Flex wheel's local-version parts from its artifacts' environment keys (`flex/runtime/envkeys`:
    torch, device, cuda, capability, cpu_capability) and its family (`default` is left out)."""
    tv = str(keys.get("torch", "0")).split("+")[0].split(".")
    torch = f"{tv[0]}.{tv[1] if len(tv) > 1 else 0}"
    if keys.get("device") == "cuda":
        cuda = str(keys.get("cuda") or "0.0").split(".")
        accel = f"cu{cuda[0]}{cuda[1] if len(cuda) > 1 else 0}"
        target = "sm" + str(keys.get("capability") or "0.0").replace(".", "")
    else:
        accel = "cpu"
        cap = "".join(ch for ch in str(keys.get("cpu_capability") or "default").lower() if ch.isalnum())
        target = cap or "default"
    fam = re.sub(r"[^a-z0-9]", "", family.lower())
    return FlexLocal(torch, accel, target, fam if fam and fam != "default" else None)


def parse_flex_local(local: str) -> FlexLocal | None:
    """``[family.]torch2.11.cu130.sm90`` / ``torch2.13.cpu.avx512`` -> its parts; None for another name."""
    m = _FLEX_LOCAL_RE.match(local.lower())
    if not m:
        return None
    if m["cuda"]:
        return FlexLocal(m["torch"], m["cuda"], m["sm"], m["family"])
    return FlexLocal(m["torch"], "cpu", m["cpu"], m["family"])


# ------------------------------------------------------------------------------------------- image tags

ALIAS_SUFFIX = "-latest"
_IMMUTABLE_TAG_RE = re.compile(
    r"^(?P<kernel>[a-z][a-z-]*?(?:-\d+)?)-?(?P<version>\d[0-9A-Za-z.]*)-(?P<family>.+)-py(?P<py>\d+\.\d+t?)$"
)


def image_family(variant: str, profile_tag: str | None = None, arch_slug: str | None = None) -> str:
    """An image tag's middle part: the variant, the profile tag (none for full), the arches where two images
    of one set would otherwise share a tag: `cu130-torch2.14-fwd128[-sm80-sm90]`."""
    return "-".join(p for p in (variant, profile_tag, arch_slug) if p)


def image_tag(kernel: str, kernel_version: str, family: str, python: str) -> str:
    """`flash-attn2.8.3-<family>-py3.12`; a kernel name ending in a digit gets a dash before the version
    (`flash-attn-3-3.0.0-cu130-sm90a-torch2.9abi3-fa3hd64128-py3.12`)."""
    sep = "-" if kernel[-1:].isdigit() else ""
    return f"{kernel}{sep}{kernel_version}-{family}-py{python}"


def parse_image_tag(tag: str) -> dict[str, str] | None:
    """kernel, version, family, py of an immutable tag (None for aliases and foreign tags); py keeps a
    free-threaded CPython's `t` (`py3.14t`)."""
    if tag.endswith(ALIAS_SUFFIX):
        return None
    m = _IMMUTABLE_TAG_RE.match(tag)
    return m.groupdict() if m else None
