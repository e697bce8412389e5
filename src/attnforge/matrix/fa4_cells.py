"""FlashAttention-4's cells and the rules that refuse one, and the name of a cell's kernel wheel (standard
library only: ``attnforge.fa4`` uses it on bare GPU hosts too).

FA4 is pure Python (``flash-attn-4``, a ``py3-none-any`` wheel); what differs per CUDA major is the CuTe DSL's
native libraries (``nvidia-cutlass-dsl-libs-cu12`` / ``-cu13``), pinned per major in matrix.yaml's ``fa4.stack``
(``matrix/fa4_section.py``). A cell is (CUDA major, torch floor, Python, GPU arch); its wheel of precompiled
kernels, ``attnforge-fa4-kernels``, names the FA4 release, the CUDA major and the arch in its local version and
the Python minor in its tag (FA4's cache fingerprint hashes the Python minor: ``attnforge.fa4.package``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from attnforge.names import fa4_local

KERNEL = "flash-attn-4"  # the kernel name a target's `kernel` axis gives for FA4 cells
WHEEL_DIST = "attnforge-fa4-kernels"
WHEEL_BASE_VERSION = "0.1.0"
# The CUDA majors the CuTe DSL ships native libraries for (nvidia-cutlass-dsl-libs-cu12 / -cu13).
CUDA_MAJORS = (12, 13)
# GPU families FA4 has kernels for and attnforge offers: Hopper (flash_fwd_sm90.py, flash_bwd_sm90.py),
# Blackwell datacenter (sm100) and consumer (sm120). FA4 also carries sm80/sm110 paths; attnforge does not
# offer them (untested here).
ARCHES = (90, 100, 120)
PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13))  # flash-attn-4: Requires-Python >=3.10
TORCH_FLOOR = (2, 11)  # the oldest torch this stack was run with here (flash-attn-4 itself names no floor)
# PyTorch's default CUDA per release (PyPI): a cell's torch must be built for the cell's CUDA major
TORCH_CUDA = {(2, 8): 12, (2, 9): 12, (2, 10): 12, (2, 11): 13, (2, 12): 13, (2, 13): 13, (2, 14): 13}
# What a declaration may ask for (FA4's Hopper path, flash_fwd_sm90.py): attnforge.fa4.declare and
# matrix.yaml's fa4.declarations check the same values.
DTYPES = ("bf16", "fp16")
HEAD_DIMS = (64, 96, 128, 192, 256)


@dataclass(frozen=True)
class Cell:
    """One FA4 cell: CUDA major, torch floor, Python, GPU arch."""

    cuda_major: int
    torch: tuple[int, int]
    python: tuple[int, int]
    arch: int

    @property
    def id(self) -> str:
        """``fa4-cu13-torch2.11-py3.12-sm90``."""
        return (
            f"fa4-cu{self.cuda_major}-torch{self.torch[0]}.{self.torch[1]}-py{self.python[0]}.{self.python[1]}"
            f"-sm{self.arch}"
        )


def rules(cell: Cell, stack_majors: Iterable[int] = CUDA_MAJORS) -> list[str]:
    """Why a cell is refused, one ``[rule-id] reason`` each; empty when it is valid. ``stack_majors``: the
    CUDA majors matrix.yaml's ``fa4.stack`` pins a stack for."""
    out = []
    if cell.arch not in ARCHES:
        out.append(f"[fa4-arch] FA4 cells are sm_90, sm_100 or sm_120, not sm_{cell.arch}")
    if cell.cuda_major not in CUDA_MAJORS:
        out.append(
            f"[fa4-cuda] the CuTe DSL ships libraries for CUDA {CUDA_MAJORS}, not CUDA {cell.cuda_major}"
        )
    elif cell.cuda_major not in set(stack_majors):
        out.append(
            f"[fa4-cuda] matrix.yaml's fa4.stack pins no stack for CUDA {cell.cuda_major} (cuda{cell.cuda_major})"
        )
    if cell.python not in PYTHONS:
        py = ".".join(map(str, cell.python))
        out.append(f"[fa4-python] flash-attn-4 needs Python 3.10-3.13, not {py}")
    if cell.torch < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        out.append(
            f"[fa4-torch] torch {cell.torch[0]}.{cell.torch[1]} is below {floor}, the oldest torch this FA4 stack "
            "has been run with"
        )
    elif cell.torch in TORCH_CUDA and TORCH_CUDA[cell.torch] != cell.cuda_major:
        out.append(
            f"[fa4-torch-cuda] torch {cell.torch[0]}.{cell.torch[1]} is built for CUDA "
            f"{TORCH_CUDA[cell.torch]} on the package index, not CUDA {cell.cuda_major}"
        )
    return out


def cells(stack_majors: Iterable[int] = CUDA_MAJORS) -> list[tuple[Cell, list[str]]]:
    """Every (CUDA major x torch floor x Python x arch) cell with its refusals."""
    majors = tuple(stack_majors)
    return [
        (c, rules(c, majors))
        for c in (
            Cell(cu, t, py, arch)
            for cu in CUDA_MAJORS
            for t in sorted(TORCH_CUDA)
            for py in PYTHONS
            for arch in ARCHES
        )
    ]


def wheel_version(fa4_version: str, cuda_major: int | str, arch: int | str) -> str:
    """``0.1.0+fa4v4.0.0b36.cu13.sm90``: the kernel wheel's version (the arch is in FA4's compile key)."""
    return f"{WHEEL_BASE_VERSION}+{fa4_local(fa4_version, cuda_major, arch).local_version}"


def wheel_name(fa4_version: str, cell: Cell) -> str:
    """``attnforge_fa4_kernels-0.1.0+fa4v4.0.0b36.cu13.sm90-py312-none-any.whl`` for a cell."""
    version = wheel_version(fa4_version, cell.cuda_major, cell.arch)
    return f"{WHEEL_DIST.replace('-', '_')}-{version}-py{cell.python[0]}{cell.python[1]}-none-any.whl"
