"""GPU architectures: which compiled arch runs on which device, and the runner label of a device."""

from __future__ import annotations


def sm_of_compute_cap(cap: str) -> str:
    """'9.0' -> 'sm_90', '12.0' -> 'sm_120' (nvidia-smi's compute_cap field)."""
    major, _, minor = cap.strip().partition(".")
    return f"sm_{int(major)}{int(minor or 0)}"


def arch_runs_on(compiled: str, device: str) -> bool:
    """Does code compiled for `compiled` run on a `device` GPU?

    CUDA SASS for sm_XY runs on the same major with an equal or higher minor (sm_80 on sm_86);
    arch-specific targets (sm_90a, sm_100a) and family targets (sm_100f) only on their exact device here.
    ROCm code objects are exact: gfx942 only on gfx942.
    """
    if compiled.startswith("gfx") or device.startswith("gfx"):
        return compiled == device
    c, d = compiled.removeprefix("sm_"), device.removeprefix("sm_")
    if c.endswith(("a", "f")):
        return c[:-1] == d
    if not (c.isdigit() and d.isdigit()):
        return False
    return c[:-1] == d[:-1] and int(c[-1]) <= int(d[-1])


def arch_label(arch: str) -> str:
    """The runner label for a device arch: sm_90 -> sm90, gfx942 -> gfx942."""
    return arch.replace("_", "")


def cuda_label(major: int) -> str:
    """The runner label saying the driver runs CUDA `major`.x builds."""
    return f"cuda{major}"
