"""The environment a compiled FlexAttention artifact is tied to (its cache-key inputs). Needs torch only.

Inductor's caches key on torch, Triton, the CUDA toolkit, the GPU (capability) and Python; an artifact from
another of these is useless at best. The driver and the GPU's marketing name are recorded for information.
"""

from __future__ import annotations

import ctypes
import platform
from typing import Any

MUST_MATCH_CUDA = ("device", "torch", "triton", "cuda", "capability", "python")
MUST_MATCH_CPU = ("device", "torch", "python", "cpu_capability")
INFO_ONLY = ("driver", "gpu", "cpu", "cxx")


def _triton_version() -> str | None:
    """Triton's version from its distribution's metadata, without importing triton (an import that a call
    served by an AOTInductor package otherwise never pays); the module's when no distribution is found."""
    from importlib import metadata

    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm", "triton-rocm"):
        try:
            return metadata.version(dist).split("+", 1)[0]
        except metadata.PackageNotFoundError:
            continue
    try:
        import triton

        return str(triton.__version__)
    except Exception:
        return None


def _driver_version() -> str | None:
    """The CUDA driver's version (``cuDriverGetVersion``), e.g. ``13.0``; None without a driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
        return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect(device: str) -> dict[str, Any]:
    """This process's cache-key inputs for ``device`` ("cuda" or "cpu")."""
    import torch

    keys: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "triton": _triton_version(),
        "cuda": torch.version.cuda,
        "python": ".".join(platform.python_version_tuple()[:2]),
        "driver": _driver_version(),
        "platform": platform.machine(),
    }
    if device == "cuda":
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            keys["gpu"] = torch.cuda.get_device_name()
            keys["capability"] = f"{major}.{minor}"
        else:
            keys["gpu"] = None
            keys["capability"] = None
    else:
        keys["cpu"] = _cpu_name()
        keys["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return keys


def mismatches(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The must-match keys that differ, as ``key: built X, here Y`` lines (empty = usable)."""
    must = MUST_MATCH_CUDA if recorded.get("device") == "cuda" else MUST_MATCH_CPU
    out = []
    for k in must:
        if recorded.get(k) != current.get(k):
            out.append(f"{k}: built with {recorded.get(k)!r}, here {current.get(k)!r}")
    return out
