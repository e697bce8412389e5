"""A tiny but real flash_attn look-alike: a `flash_attn` package and a torch extension `flash_attn_2_cuda`.

Mirrors upstream's knobs that matter to packaging: FLASH_ATTN_LOCAL_VERSION (local version segment),
FLASH_ATTN_CUDA_ARCHS (";"-separated, e.g. "90"), and builds a CUDA extension when torch is a CUDA
build and nvcc is found (else a C++ extension: the torch+cpu build used by the mismatch tests).

csrc/flash_attn/ holds, at upstream's paths, the lines of flash-attn 2.8.3's sources that attnforge's
patches edit (verbatim excerpts, never compiled here): the builder applies a cell's patches to this fixture
exactly as to the real source, and a patch that does not fit fails the build (none is skipped).
"""

import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

version = "2.8.3"
local = os.environ.get("FLASH_ATTN_LOCAL_VERSION")
if local:
    version += "+" + local

torch_major_minor = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
std = "-std=c++20" if torch_major_minor >= (2, 14) else "-std=c++17"
# -g0 overrides Python's -g: debug info for torch's headers doubles the compile time
cxx_flags = ["-O1", "-g0", std]
use_cuda = (
    torch.version.cuda is not None and CUDA_HOME is not None and os.environ.get("MINI_FA_CPP_ONLY") != "1"
)

if use_cuda:
    archs = os.environ.get("FLASH_ATTN_CUDA_ARCHS", "90").split(";")
    ext = CUDAExtension(
        "flash_attn_2_cuda",
        ["csrc/flash_api.cpp", "csrc/add_one_kernel.cu"],
        define_macros=[("MINI_FA_CUDA", "1")],
        extra_compile_args={
            "cxx": cxx_flags,
            "nvcc": ["-O2"] + [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs],
        },
    )
else:
    ext = CppExtension("flash_attn_2_cuda", ["csrc/flash_api.cpp"], extra_compile_args=cxx_flags)

setup(
    name="flash_attn",
    version=version,
    description="attnforge test fixture shaped like flash-attn (not the real kernels)",
    packages=["flash_attn"],
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
    install_requires=["torch"],
)
