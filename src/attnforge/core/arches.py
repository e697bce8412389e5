"""GPU architectures: which compiled arch runs on which device, and the runner label of a device."""

from __future__ import annotations

import re

# LLVM AMDGPU processors from GFX9 on (llvm.org/docs/AMDGPUUsage.html), for telling real names from
# mis-decoded ones; an unlisted name of the right shape is still accepted as it is.
KNOWN_GFX = frozenset(
    (
        "gfx900",
        "gfx902",
        "gfx904",
        "gfx906",
        "gfx908",
        "gfx909",
        "gfx90a",
        "gfx90c",
        "gfx940",
        "gfx941",
        "gfx942",
        "gfx950",
        "gfx1010",
        "gfx1011",
        "gfx1012",
        "gfx1013",
        "gfx1030",
        "gfx1031",
        "gfx1032",
        "gfx1033",
        "gfx1034",
        "gfx1035",
        "gfx1036",
        "gfx1100",
        "gfx1101",
        "gfx1102",
        "gfx1103",
        "gfx1150",
        "gfx1151",
        "gfx1152",
        "gfx1153",
        "gfx1200",
        "gfx1201",
        "gfx1250",
        "gfx1251",
    )
)
_GFX_RE = re.compile(r"gfx[0-9a-f]{3,4}")
_DECIMAL_STEPPING_RE = re.compile(r"gfx(9|1[0-2])(\d)(1[0-5])")


def gfx_from_target_version(value: int) -> str:
    """KFD's gfx_target_version (90010) -> gfx90a: major*10000 + minor*100 + stepping, hex digits in LLVM's name."""
    major, minor, step = value // 10000, (value // 100) % 100, value % 100
    return f"gfx{major}{minor:x}{step:x}"


def normalize_gfx(raw: object) -> str | None:
    """A gfx name from any tool's spelling: gfx942, GFX942, 90402, amdgcn-amd-amdhsa--gfx90a:xnack-, and
    gfx9010 (tools that print the stepping in decimal: 9.0.10 is gfx90a); None when it is not one."""
    text = str(raw).strip().lower()
    if text.isdigit() and len(text) >= 5:
        value = int(text)
        return gfx_from_target_version(value) if value else None
    text = text.removeprefix("amdgcn-amd-amdhsa--").split(":")[0]
    if text in KNOWN_GFX:
        return text
    m = _DECIMAL_STEPPING_RE.fullmatch(text)
    if m:
        return f"gfx{m[1]}{int(m[2]):x}{int(m[3]):x}"
    return text if _GFX_RE.fullmatch(text) else None


def sm_of_compute_cap(cap: str) -> str:
    """'9.0' -> 'sm_90', '12.0' -> 'sm_120' (nvidia-smi's compute_cap field)."""
    major, _, minor = cap.strip().partition(".")
    return f"sm_{int(major)}{int(minor or 0)}"


def arch_number(arch: str) -> int:
    """sm_90a -> 90, sm_100 -> 100 (gfx arches -> -1)."""
    if not arch.startswith("sm_"):
        return -1
    return int("".join(ch for ch in arch[3:] if ch.isdigit()))


def arch_runs_on(compiled: str, device: str) -> bool:
    """Does code compiled for `compiled` run on a `device` GPU?

    CUDA SASS for sm_XY runs on the same major with an equal or higher minor (sm_80 on sm_86); family
    targets too (sm_100f on 10.0 and 10.3, sm_120f on 12.0 and 12.1: CUDA 12.9's family-specific features);
    arch-specific targets (sm_90a, sm_100a) only on their exact device. ROCm code objects are exact: gfx942
    only on gfx942. Embedded PTX (JIT on newer GPUs) is the arch policy's business (matrix.arch_policy).
    """
    if compiled.startswith("gfx") or device.startswith("gfx"):
        return compiled == device
    c, d = compiled.removeprefix("sm_"), device.removeprefix("sm_")
    if c.endswith("a"):
        return c[:-1] == d
    c = c.removesuffix("f")
    if not (c.isdigit() and d.isdigit()):
        return False
    return c[:-1] == d[:-1] and int(c[-1]) <= int(d[-1])


def arch_label(arch: str) -> str:
    """The runner label for a device arch: sm_90 -> sm90, gfx942 -> gfx942."""
    return arch.replace("_", "")


def cuda_label(major: int) -> str:
    """The runner label saying the driver runs CUDA `major`.x builds."""
    return f"cuda{major}"
