"""Inspect a Python environment: Python, platform, torch (CUDA/HIP, C++ ABI), GPUs, driver, flash-attn.

Standard library only: `attnforge which/doctor --python PATH` runs this file's source with that
interpreter (`python -c`), so the environment inspected need not have attnforge installed. Prints one
JSON object. torch and the extension are imported in that process, never in attnforge's own.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from typing import Any


def nvidia_driver() -> dict[str, Any] | None:
    """Driver version and the CUDA version it supports, from nvidia-smi (None without one): the probe's
    `driver`, and what a parity run records beside its verdict (manifest and signed parity record)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    drv = re.search(r"Driver Version:\s*([\d.]+)", out)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", out)
    return {"driver": drv.group(1) if drv else None, "cuda": cuda.group(1) if cuda else None}


def _torch() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising anything
        return {"installed": False, "error": f"{type(exc).__name__}: {exc}"}
    info: dict[str, Any] = {
        "installed": True,
        "version": str(torch.__version__),
        "cuda": getattr(torch.version, "cuda", None),
        "hip": getattr(torch.version, "hip", None),
        "cxx11_abi": bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)),
        "gpus": [],
    }
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                info["gpus"].append(
                    {
                        "name": props.name,
                        "capability": [props.major, props.minor],
                        # ROCm's arch name (gfx942:sramecc+:xnack-); CUDA builds fill it with the device name
                        "gcn_arch": getattr(props, "gcnArchName", None) if info["hip"] else None,
                    }
                )
    except Exception as exc:
        info["gpu_error"] = f"{type(exc).__name__}: {exc}"
    return info


def _flash_attn(project: str, module: str) -> dict[str, Any]:
    """The installed distribution, its build record, and whether the extension imports."""
    from importlib import metadata

    try:
        dist = metadata.distribution(project)
    except metadata.PackageNotFoundError:
        return {"installed": False}
    info: dict[str, Any] = {
        "installed": True,
        "version": dist.version,
        "requires": list(dist.requires or []),
        "location": str(dist.locate_file("")),
        "build_record": None,
    }
    text = dist.read_text("attnforge_build.json")
    if text:
        try:
            info["build_record"] = json.loads(text)
        except ValueError:
            info["build_record_error"] = "attnforge_build.json is not valid JSON"
    if not module:
        return info
    try:
        import torch  # noqa: F401 - libtorch and libc10 must be loaded before the extension

        ext = __import__(module)
        info["import"] = {"ok": True, "file": getattr(ext, "__file__", None)}
    except BaseException as exc:
        info["import"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return info


def probe(project: str | None = None, module: str | None = None) -> dict[str, Any]:
    """Everything `which` and `doctor` compare wheels against."""
    libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
    glibc = None
    if libc and libc.startswith("glibc "):
        glibc = libc.split()[1]
    result: dict[str, Any] = {
        "executable": sys.executable,
        "python": "{}.{}.{}".format(*sys.version_info[:3]),
        "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "implementation": sys.implementation.name,
        "machine": platform.machine(),
        "system": platform.system(),
        "glibc": glibc,
        "torch": _torch(),
        "driver": nvidia_driver(),
    }
    if project:
        result["flash_attn"] = _flash_attn(project, module or "")
    return result


def main(argv: list[str]) -> int:
    project = argv[0] if argv else None
    module = argv[1] if len(argv) > 1 else None
    data = probe(project, module)
    sys.stdout.flush()
    print("ATTNFORGE-PROBE " + json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
