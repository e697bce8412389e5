"""FlashAttention-4 as a kernel of the matrix: its pinned package stack per CUDA major, its cells and the
rules that refuse a cell (standard library only).

FA4 is pure Python (``flash-attn-4``, a ``py3-none-any`` wheel); what differs per CUDA major is the CuTe DSL's
native libraries (``nvidia-cutlass-dsl-libs-cu12`` / ``-cu13``). A cell is (CUDA major, torch floor, Python,
GPU family); the wheel of precompiled kernels of a cell additionally pins what FA4's cache fingerprint hashes
(FA4's sources, the Python minor, the cutlass-dsl and tvm-ffi versions: ``attnforge.fa4.package``).
"""

from __future__ import annotations

from dataclasses import dataclass

FA4_VERSION = "4.0.0b36"
# The stack seen working together on an H100 (torch 2.11.0+cu130, Python 3.12; docs/fa4.md).
COMMON = {
    "flash-attn-4": FA4_VERSION,
    "nvidia-cutlass-dsl": "4.8.1",
    "nvidia-cutlass-dsl-libs-base": "4.8.1",
    "nvidia-cutlass-dsl-libs-core": "4.8.1",
    "apache-tvm-ffi": "0.1.15.post2",
    "quack-kernels": "0.6.5",
    "torch-c-dlpack-ext": "0.1.5",
    "einops": None,
}
CUDA_MAJORS = (12, 13)
# GPU families FA4 has kernels for and attnforge offers: Hopper (flash_fwd_sm90.py, flash_bwd_sm90.py),
# Blackwell datacenter (sm100) and consumer (sm120). FA4 also carries sm80/sm110 paths; attnforge does not
# offer them (untested here).
ARCHES = (90, 100, 120)
PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13))  # flash-attn-4: Requires-Python >=3.10
TORCH_FLOOR = (2, 11)  # the oldest torch this stack was run with here (flash-attn-4 itself names no floor)
# PyTorch's default CUDA per release (PyPI): a cell's torch must be built for the cell's CUDA major
TORCH_CUDA = {(2, 8): 12, (2, 9): 12, (2, 10): 12, (2, 11): 13, (2, 12): 13, (2, 13): 13, (2, 14): 13}


def pins(cuda_major: int) -> dict[str, str | None]:
    """Every package of the FA4 stack for a CUDA major (None: not pinned)."""
    if cuda_major not in CUDA_MAJORS:
        raise ValueError(f"FA4 has no CuTe DSL libraries for CUDA {cuda_major} (only {CUDA_MAJORS})")
    out = dict(COMMON)
    out[f"nvidia-cutlass-dsl-libs-cu{cuda_major}"] = COMMON["nvidia-cutlass-dsl"]
    return out


def requirements(cuda_major: int) -> list[str]:
    """``pip install`` lines for the stack of a CUDA major."""
    return [f"{k}=={v}" if v else k for k, v in pins(cuda_major).items()]


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


def rules(cell: Cell) -> list[str]:
    """Why a cell is refused, one ``[rule-id] reason`` each; empty when it is valid."""
    out = []
    if cell.arch not in ARCHES:
        out.append(f"[fa4-arch] FA4 cells are sm_90, sm_100 or sm_120, not sm_{cell.arch}")
    if cell.cuda_major not in CUDA_MAJORS:
        out.append(
            f"[fa4-cuda] the CuTe DSL ships libraries for CUDA {CUDA_MAJORS}, not CUDA {cell.cuda_major}"
        )
    if cell.python not in PYTHONS:
        py = ".".join(map(str, cell.python))
        out.append(f"[fa4-python] flash-attn-4 {FA4_VERSION} needs Python 3.10-3.13, not {py}")
    if cell.torch < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        out.append(
            f"[fa4-torch] torch {cell.torch[0]}.{cell.torch[1]} is below {floor}, the oldest torch this FA4 stack "
            "has been run with"
        )
    elif TORCH_CUDA.get(cell.torch, 13) != cell.cuda_major and cell.torch in TORCH_CUDA:
        out.append(
            f"[fa4-torch-cuda] torch {cell.torch[0]}.{cell.torch[1]} is built for CUDA "
            f"{TORCH_CUDA[cell.torch]} on the package index, not CUDA {cell.cuda_major}"
        )
    return out


def cells() -> list[tuple[Cell, list[str]]]:
    """Every (CUDA major x torch floor x Python x arch) cell with its refusals."""
    return [
        (c, rules(c))
        for c in (
            Cell(cu, t, py, arch)
            for cu in CUDA_MAJORS
            for t in sorted(TORCH_CUDA)
            for py in PYTHONS
            for arch in ARCHES
        )
    ]
