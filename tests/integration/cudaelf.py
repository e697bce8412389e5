"""The GPU code inside a built wheel: the arches of its cubins and the CUDA release that made them.

Read with NVIDIA's `cuobjdump`: `--list-elf` names one cubin per (unit, arch); `--dump-elf` prints each
cubin's ELF header, with the CUDA release of the ptxas that assembled it (`sm=80, toolkit=124` for CUDA 12.4,
`sm=90, toolkit=13.0` from CUDA 13), and, from CUDA 13, a `.note.nv.tkinfo` note (`Tool Version: Cuda
compilation tools, release 13.0, V13.0.88`). The host code's `.comment` (readelf) names the host compiler.
`find_cuobjdump` takes `$CUOBJDUMP`, PATH or /usr/local/cuda/bin, else installs NVIDIA's PyPI
`nvidia-cuda-cuobjdump` (a CUDA 13 build, independent of the toolkit under test) into a tools folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from attnforge.core.errors import EnvironmentProblem

CUOBJDUMP_WHEEL = "nvidia-cuda-cuobjdump==13.2.86"
_ELF_RE = re.compile(r"^ELF file\s+\d+:\s+(\S+)$", re.MULTILINE)
_HEADER_RE = re.compile(r"\bsm=(\d+[a-z]?),\s*toolkit=(\d+(?:\.\d+)?)")  # toolkit=124 (12.x) or 13.0
_TOOL_RE = re.compile(r"Tool Version:\s*(.+?)\s*$", re.MULTILINE)
_PTX_RE = re.compile(r"^PTX file\s+\d+:\s+(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class CudaCode:
    """What the cubins of one shared object say about themselves."""

    library: str
    cubins: int
    arches: list[str]  # sm_80, sm_90 (from the cubins' ELF headers)
    toolkits: list[str]  # "12.4" (ELF header `toolkit=124`, or `toolkit=13.0`)
    tools: list[str]  # "Cuda compilation tools, release 13.0, V13.0.88" (.note.nv.tkinfo; CUDA 13 only)
    ptx: list[str]  # embedded PTX files (none for a wheel compiled for real arches only)
    host_compilers: list[str]  # the host code's .comment: "GCC: (Debian 12.2.0-14+deb12u1) 12.2.0"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def find_cuobjdump(tools_dir: Path | None = None) -> str:
    """A cuobjdump to run: $CUOBJDUMP, PATH, /usr/local/cuda/bin, or PyPI's (installed into `tools_dir`)."""
    for cand in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    if tools_dir is None:
        raise EnvironmentProblem("no cuobjdump: set CUOBJDUMP, put one on PATH, or give a tools folder")
    target = tools_dir / CUOBJDUMP_WHEEL.replace("==", "-")
    found = sorted(target.glob("nvidia/*/bin/cuobjdump"))
    if not found:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--target",
                str(target),
                CUOBJDUMP_WHEEL,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        found = sorted(target.glob("nvidia/*/bin/cuobjdump"))
        if proc.returncode != 0 or not found:
            raise EnvironmentProblem(f"cannot install {CUOBJDUMP_WHEEL} into {target}: {proc.stderr[-500:]}")
    return str(found[0])


def _run(cuobjdump: str, *args: str) -> str:
    proc = subprocess.run([cuobjdump, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0 and "does not contain" not in proc.stderr:
        raise EnvironmentProblem(f"{cuobjdump} {' '.join(args)} failed: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def _toolkit(text: str) -> str:
    """`124` -> `12.4` (CUDA 12 cubin headers); `13.0` as it is."""
    return text if "." in text else f"{int(text) // 10}.{int(text) % 10}"


def _comment(library: Path) -> list[str]:
    readelf = shutil.which("readelf")
    if not readelf:
        return []
    proc = subprocess.run(
        [readelf, "-p", ".comment", str(library)], capture_output=True, text=True, check=False
    )
    return sorted({ln.split("]", 1)[1].strip() for ln in proc.stdout.splitlines() if "]" in ln})


def cuda_code(library: Path, cuobjdump: str) -> CudaCode:
    """The cubins of a shared object: their arches, the toolkit in their headers, the ptxas that made them."""
    listed = _ELF_RE.findall(_run(cuobjdump, "--list-elf", str(library)))
    dump = _run(cuobjdump, "--dump-elf", str(library)) if listed else ""
    headers = _HEADER_RE.findall(dump)
    return CudaCode(
        library=library.name,
        cubins=len(listed),
        arches=sorted({f"sm_{sm}" for sm, _ in headers}),
        toolkits=sorted({_toolkit(tk) for _, tk in headers}),
        tools=sorted(set(_TOOL_RE.findall(dump))),
        ptx=_PTX_RE.findall(_run(cuobjdump, "--list-ptx", str(library))),
        host_compilers=_comment(library),
    )


def wheel_cuda_code(wheel: Path, cuobjdump: str) -> list[CudaCode]:
    """`cuda_code` of every shared object in a wheel (unpacked into a temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="attnforge-cudaelf-") as tmp, zipfile.ZipFile(wheel) as zf:
        out = []
        for name in sorted(n for n in zf.namelist() if n.endswith(".so") or ".so." in n):
            path = Path(zf.extract(name, tmp))
            out.append(cuda_code(path, cuobjdump))
        return out
