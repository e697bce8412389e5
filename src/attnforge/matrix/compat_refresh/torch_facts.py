"""A torch family's facts as the package index states them: its releases and Python tags (from the file list),
its default CUDA, Requires-Python, C++ standard and Philox layout (from members of its Linux wheels)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from attnforge.matrix.compat_refresh.index import Index, IndexFile

VERSION_PY = "torch/version.py"
ATEN_H = "torch/include/ATen/ATen.h"
PHILOX_RAW = "torch/include/ATen/cuda/detail/PhiloxCudaStateRaw.cuh"
TORCH_CONFIG = "torch/share/cmake/Torch/TorchConfig.cmake"

_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"]([0-9.]+)['\"]", re.M)
_STD = re.compile(r"#error\s+C\+\+(\d+) or later", re.M)
_ABI = re.compile(r"_GLIBCXX_USE_CXX11_ABI=([01])")
_INTRAGRAPH = re.compile(r"\b(u?int\d+_t)\s+offset_intragraph_\b")
_TOOLKIT_PIN = re.compile(r"^Requires-Dist:\s*cuda-toolkit(?:\[[^\]]*\])?\s*==\s*([0-9.]+)", re.M)
_RUNTIME_PIN = re.compile(r"^Requires-Dist:\s*nvidia-cuda-runtime(?:-cu\d+)?\s*==\s*([0-9.]+)", re.M)


@dataclass(frozen=True)
class Wheel:
    """A Linux wheel of a project: version, CPython minor ("3.14"), free-threaded, platform."""

    file: IndexFile
    version: Version
    python: str
    free_threaded: bool
    platform: str  # x86_64 | aarch64


def linux_wheels(files: list[IndexFile]) -> list[Wheel]:
    """The manylinux CPython wheels among `files` (pre-releases, dev and local versions left out)."""
    out = []
    for f in files:
        try:
            _, version, _, tags = parse_wheel_filename(f.filename)
        except InvalidWheelFilename:
            continue
        if version.is_prerelease or version.is_devrelease or version.local:
            continue
        for tag in tags:
            if not tag.interpreter.startswith("cp") or "manylinux" not in tag.platform:
                continue
            minor = tag.interpreter[2:]
            plat = "aarch64" if tag.platform.endswith("aarch64") else "x86_64"
            ft = tag.abi.endswith("t")
            out.append(Wheel(f, version, f"{minor[0]}.{minor[1:]}", ft, plat))
            break
    return out


def _date(files: list[IndexFile]) -> str:
    times = [f.upload_time for f in files if f.upload_time]
    return min(times)[:10] if times else ""


def _sort_py(versions: set[str]) -> list[str]:
    return sorted(versions, key=Version)


@dataclass
class TorchFamily:
    """What the index says about one torch family (fields named as [[torch]] rows name them)."""

    family: str
    facts: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)  # field -> why it could not be read


def families(wheels: list[Wheel]) -> dict[str, list[Wheel]]:
    """Wheels grouped by family ("2.15")."""
    out: dict[str, list[Wheel]] = defaultdict(list)
    for w in wheels:
        out[f"{w.version.major}.{w.version.minor}"].append(w)
    return dict(out)


def listing_facts(family: str, wheels: list[Wheel]) -> TorchFamily:
    """The facts the file list alone gives: latest release, dates, Python tags, Requires-Python."""
    latest = max(w.version for w in wheels)
    first = min(w.version for w in wheels)
    x86 = [w for w in wheels if w.version == latest and w.platform == "x86_64"]
    out = TorchFamily(family)
    out.facts["latest"] = str(latest)
    released = _date([w.file for w in wheels if w.version == first])
    if released:
        out.facts["released"] = released
        out.facts["latest_released"] = _date([w.file for w in wheels if w.version == latest])
    else:
        out.unknown["released"] = "the index gives no upload times (PEP 700)"
    out.facts["python"] = _sort_py({w.python for w in x86 if not w.free_threaded})
    out.facts["free_threaded"] = _sort_py({w.python for w in x86 if w.free_threaded})
    requires = {w.file.requires_python for w in x86 if w.file.requires_python}
    if len(requires) == 1:
        out.facts["requires_python"] = requires.pop()
    out.sources.append(f"simple API file list of torch {latest} (Linux x86_64 wheels: Python tags)")
    return out


def wheel_facts(index: Index, fam: TorchFamily, wheels: list[Wheel]) -> None:
    """Add the facts read out of the latest release's wheels: default CUDA (torch/version.py, cross-checked
    with the cuda-toolkit / nvidia-cuda-runtime pin), C++ standard (ATen.h), Philox layout."""
    latest = Version(fam.facts["latest"])
    pick = _pick(wheels, latest, "x86_64")
    if pick is None:
        fam.unknown["pypi_cuda"] = f"no CPython Linux x86_64 wheel of torch {latest}"
        return
    meta = f"torch-{latest}.dist-info/METADATA"
    got = index.members(pick.file, [VERSION_PY, meta, ATEN_H, PHILOX_RAW, TORCH_CONFIG])
    cuda = _CUDA.search(got[VERSION_PY] or "")
    pin = _TOOLKIT_PIN.search(got[meta] or "") or _RUNTIME_PIN.search(got[meta] or "")
    if cuda is None:
        fam.unknown["pypi_cuda"] = f"{pick.file.filename}: torch/version.py names no CUDA (a CPU build)"
    elif pin is not None and not pin.group(1).startswith(cuda.group(1)):
        fam.unknown["pypi_cuda"] = (
            f"{pick.file.filename}: torch/version.py says {cuda.group(1)}, Requires-Dist pins {pin.group(1)}"
        )
    else:
        fam.facts["pypi_cuda"] = cuda.group(1)
        fam.facts["cuda"] = [cuda.group(1)]
        pinned = f", Requires-Dist cuda {pin.group(1)}" if pin else ""
        fam.sources.append(f"{pick.file.filename}: torch/version.py cuda='{cuda.group(1)}'{pinned}")
    std = _STD.search(got[ATEN_H] or "")
    if std is None:
        fam.unknown["cxx_std"] = f"{pick.file.filename}: ATen.h states no C++ standard"
    else:
        fam.facts["cxx_std"] = int(std.group(1))
        fam.sources.append(f"ATen.h '#error C++{std.group(1)} or later'")
    raw = _INTRAGRAPH.search(got[PHILOX_RAW] or "")
    if raw is None:
        fam.unknown["philox_offset_intragraph"] = f"{pick.file.filename}: no offset_intragraph_ member"
    else:
        fam.facts["philox_offset_intragraph"] = raw.group(1)
        fam.sources.append(f"PhiloxCudaStateRaw.cuh '{raw.group(1)} offset_intragraph_'")
    if got[TORCH_CONFIG] is None:
        fam.unknown["cxx11_abi"] = f"{pick.file.filename}: no {TORCH_CONFIG}"
    else:
        abi = _ABI.search(got[TORCH_CONFIG] or "")
        fam.facts["cxx11_abi"] = [abi is None or abi.group(1) == "1"]
        fam.sources.append(
            f"TorchConfig.cmake _GLIBCXX_USE_CXX11_ABI={abi.group(1)}"
            if abi
            else "TorchConfig.cmake sets no _GLIBCXX_USE_CXX11_ABI (libstdc++'s default: the cxx11 ABI)"
        )
    arm = _pick(wheels, latest, "aarch64")
    if arm is not None:
        arm_cuda = _CUDA.search(index.members(arm.file, [VERSION_PY])[VERSION_PY] or "")
        if arm_cuda is not None:
            fam.facts["pypi_aarch64_cuda"] = arm_cuda.group(1)
            fam.facts["aarch64_cuda"] = [arm_cuda.group(1)]
            fam.sources.append(f"{arm.file.filename}: torch/version.py cuda='{arm_cuda.group(1)}'")


def _pick(wheels: list[Wheel], version: Version, platform: str) -> Wheel | None:
    """The latest release's wheel to read: cp312 where it exists, else the newest non-free-threaded one."""
    cands = [w for w in wheels if w.version == version and w.platform == platform and not w.free_threaded]
    cands.sort(key=lambda w: (w.python == "3.12", Version(w.python)))
    return cands[-1] if cands else None


def first_torch_per_python(wheels: list[Wheel]) -> dict[str, str]:
    """Each CPython minor and the oldest torch release with a Linux x86_64 wheel for it (free-threaded
    builds left out), as [[python]] rows name them."""
    out: dict[str, Version] = {}
    for w in wheels:
        first = out.get(w.python)
        if w.platform == "x86_64" and not w.free_threaded and (first is None or w.version < first):
            out[w.python] = w.version
    return {py: str(v) for py, v in out.items()}
