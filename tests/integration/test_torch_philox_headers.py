"""The binding's Philox conversion (patches/attnforge_philox_torch.h) against the headers of every torch release
the matrix names, without CUDA and without installing torch.

For each release of each torch family a torch-free cell of matrix.yaml names (X.Y.0 up to compat.toml's
`latest`: the wheel pins `torch==X.Y.*`), three headers are read from its PyPI wheel by HTTP range requests
and cached (torch_headers.headers_cache(): ~/.cache/attnforge/torch-headers). g++ compiles a probe
with the conversion's static_asserts against them and runs it: torch's own `unpack` and the kernels'
`philox_unpack` of the converted state agree, captured or not. compat.toml's `philox_offset_intragraph` must
name the type the headers declare. A release whose headers cannot be fetched skips here and fails in CI (env
CI set). Synthetic headers prove that a changed layout fails to compile with the member named.
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from attnforge.builder.patches import PATCHES_DIR
from attnforge.core.errors import EnvironmentProblem
from attnforge.matrix.compat import load_compat
from attnforge.matrix.project import Project

from .torch_headers import torch_headers

ROOT = Path(__file__).resolve().parents[2]
RAW = "ATen/cuda/detail/PhiloxCudaStateRaw.cuh"

# What the probe needs of cuda_runtime.h: attnforge_torch_free.h's and torch's UnpackRaw.cuh's names, host-only.
CUDA_STUB = """\
#pragma once
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
static const cudaError_t cudaSuccess = 0;
inline const char *cudaGetErrorString(cudaError_t) { return "stub"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
"""

PROBE = """\
#include <cstdint>
#include <cstdio>
#include <limits>
#include <tuple>

#include "attnforge_philox_torch.h"
#include "attnforge_torch_free.h"
#include <ATen/cuda/detail/UnpackRaw.cuh>

static bool same(const at::PhiloxCudaState &s) {
    return at::cuda::philox::unpack(s) == attnforge::philox_unpack(attnforge::convert_philox(s));
}

int main() {
    using Intragraph = attnforge::torch_philox::Intragraph;
    int64_t seed = 0x5eed5eed5eedLL, offset = (int64_t{1} << 40) + 12345;
    const at::PhiloxCudaState plain(0xfedcba9876543210ULL, 0x0123456789abcdefULL);
    const at::PhiloxCudaState captured(&seed, &offset, std::numeric_limits<Intragraph>::max() - 7);
    if (!same(plain) || !same(captured)) { return 1; }
    std::printf("%zu %zu\\n", sizeof(at::PhiloxCudaState), sizeof(Intragraph));
    return 0;
}
"""


@cache
def matrix_torch_releases() -> list[str]:
    """Every release of the torch families that torch-free cells of matrix.yaml name."""
    project = Project(ROOT / "matrix.yaml")
    families: set[str] = set()
    for target in project.matrix.targets:
        for v in project.plan(target).verdicts:
            if v.cell.torch_free_kernels:
                families.add(v.cell.torch_family)
    data = load_compat(None)
    releases = []
    for family in sorted(families, key=lambda f: tuple(int(x) for x in f.split("."))):
        row = data.torch_release(family)
        assert row is not None, family
        last = int(row.latest.split(".")[2])
        releases += [f"{family}.{n}" for n in range(last + 1)]
    return releases


def headers(version: str) -> Path:
    """The cached include folder of torch==version; fail in CI, skip elsewhere, when it cannot be fetched."""
    try:
        return torch_headers(version)
    except EnvironmentProblem as exc:
        if os.environ.get("CI"):
            pytest.fail(f"torch {version}'s headers: {exc}")
        pytest.skip(f"torch {version}'s headers cannot be fetched here: {exc}")


def compile_probe(include: Path, tmp: Path, std: int = 17) -> subprocess.CompletedProcess[str]:
    """g++ the probe against `include` (torch's headers or a synthetic set) and the patch headers."""
    stub = tmp / "stub"
    stub.mkdir(exist_ok=True)
    (stub / "cuda_runtime.h").write_text(CUDA_STUB)
    (tmp / "probe.cpp").write_text(PROBE)
    cmd = [
        "g++",
        f"-std=c++{std}",
        "-Wall",
        "-Werror",
        f"-I{PATCHES_DIR}",
        f"-I{include}",
        f"-I{stub}",
        str(tmp / "probe.cpp"),
        "-o",
        str(tmp / "probe"),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)


def test_every_release_of_torch_2_5_to_2_14_is_checked() -> None:
    """The release target names torch 2.5-2.14; each family counts from X.Y.0 (wheels pin torch==X.Y.*)."""
    releases = matrix_torch_releases()
    assert {"2.5.0", "2.5.1", "2.9.0", "2.9.1", "2.10.0", "2.14.0", "2.14.1"} <= set(releases), releases
    assert {".".join(r.split(".")[:2]) for r in releases} >= {f"2.{m}" for m in range(5, 15)}


@pytest.mark.parametrize("version", matrix_torch_releases())
def test_conversion_compiles_and_agrees_with_torchs_unpack(version: str, tmp_path: Path) -> None:
    include = headers(version)
    declared = re.search(r"^\s*(\w+) offset_intragraph_ = 0;", (include / RAW).read_text(), re.M)
    assert declared, f"torch {version}: no offset_intragraph_ member in {RAW}"
    row = load_compat(None).torch_release(version)
    assert row is not None
    assert row.philox_offset_intragraph == declared.group(1), (
        f"compat.toml says torch {row.family} holds {row.philox_offset_intragraph}, {RAW} declares {declared.group(1)}"
    )
    built = compile_probe(include, tmp_path, std=row.cxx_std)
    assert built.returncode == 0, built.stderr[-3000:]
    ran = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=False, timeout=60)
    assert ran.returncode == 0, f"torch {version}: torch's unpack and the kernels' differ after conversion"
    size, width = (int(x) for x in ran.stdout.split())
    assert (size, width) == (
        {"uint32_t": 24, "uint64_t": 32}[declared.group(1)],
        int(declared.group(1)[4:6]) // 8,
    )


LAYOUT = """\
#pragma once
#include <cstdint>
namespace at {{
struct PhiloxCudaState {{
  PhiloxCudaState() = default;
  PhiloxCudaState(uint64_t seed, uint64_t offset) {{ seed_.val = seed; offset_.val = offset; }}
  PhiloxCudaState(int64_t* seed, int64_t* offset, uint64_t intragraph) {{
    seed_.ptr = reinterpret_cast<decltype(seed_.ptr)>(seed);
    offset_.ptr = reinterpret_cast<decltype(offset_.ptr)>(offset);
    offset_intragraph_ = intragraph;
    captured_ = true;
  }}
  union Payload {{ uint64_t val; {ptr} ptr; }};
  Payload seed_{{}};
  Payload offset_{{}};
  {members}
}};
}}
"""
UNPACK = """\
namespace at::cuda::philox {
__host__ __device__ __forceinline__ std::tuple<uint64_t, uint64_t> unpack(at::PhiloxCudaState arg) {
  return arg.captured_ ? std::make_tuple(static_cast<uint64_t>(*arg.seed_.ptr),
                                         static_cast<uint64_t>(*arg.offset_.ptr + arg.offset_intragraph_))
                       : std::make_tuple(arg.seed_.val, arg.offset_.val);
}
}
"""


def synthetic(tmp: Path, members: str, ptr: str = "int64_t*") -> Path:
    """An include folder whose at::PhiloxCudaState has `members` after the payloads."""
    include = tmp / "fake"
    (include / "ATen/cuda/detail").mkdir(parents=True)
    (include / "ATen/cuda/PhiloxCudaState.h").write_text(LAYOUT.format(ptr=ptr, members=members))
    (include / "ATen/cuda/detail/UnpackRaw.cuh").write_text(UNPACK)
    return include


def test_both_real_layouts_pass_as_synthetic_headers(tmp_path: Path) -> None:
    for n, ty in enumerate(("uint32_t", "uint64_t")):
        tmp = tmp_path / str(n)
        tmp.mkdir()
        built = compile_probe(synthetic(tmp, f"{ty} offset_intragraph_ = 0; bool captured_ = false;"), tmp)
        assert built.returncode == 0, built.stderr[-3000:]


@pytest.mark.parametrize(
    ("members", "ptr", "message"),
    [
        (
            "int64_t offset_intragraph_ = 0; bool captured_ = false;",
            "int64_t*",
            "offset_intragraph_ changed type: not an unsigned integer of at most 64 bits",
        ),
        (
            "uint32_t offset_intragraph_ = 0; uint32_t generation_ = 0; bool captured_ = false;",
            "int64_t*",
            "captured_ moved",
        ),
        (
            "uint64_t offset_intragraph_ = 0; bool captured_ = false; uint64_t generation_ = 0;",
            "int64_t*",
            "at::PhiloxCudaState has a member attnforge does not convert",
        ),
        ("uint64_t offset_intragraph_ = 0; int captured_ = 0;", "int64_t*", "captured_ changed type"),
        (
            "uint64_t offset_intragraph_ = 0; bool captured_ = false;",
            "uint64_t*",
            "Payload::ptr changed type",
        ),
    ],
)
def test_a_changed_layout_fails_to_compile_naming_the_member(
    members: str, ptr: str, message: str, tmp_path: Path
) -> None:
    built = compile_probe(synthetic(tmp_path, members, ptr), tmp_path)
    assert built.returncode != 0
    assert f"static assertion failed: {message}" in built.stderr, built.stderr[-3000:]
