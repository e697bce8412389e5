"""attnforge test fixture: a one-kernel torch CUDA extension with three compile units.

Test knobs (environment):
- TINYEXT_KILL_UNIT=kernel_b.cu  the nvcc wrapper SIGKILLs itself on that unit (an OOM kill look-alike)
- TINYEXT_BREAK=1                kernel_b.cu gets a deliberate compile error
nvcc runs through nvcc_wrapper.sh (PYTORCH_NVCC, unless already set, e.g. to "ccache nvcc"), so ninja's
commands do not change between runs.
"""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

here = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("PYTORCH_NVCC", os.path.join(here, "nvcc_wrapper.sh"))
archs = [a for a in os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0").replace(";", " ").split() if a]
gencode = [f"-gencode=arch=compute_{a.replace('.', '')},code=sm_{a.replace('.', '')}" for a in archs]
nvcc = ["-O2", *gencode] + (["-DTINYEXT_BREAK"] if os.environ.get("TINYEXT_BREAK") == "1" else [])

setup(
    name="tinyext",
    version="0.1.0"
    + ("+" + os.environ["TINYEXT_LOCAL_VERSION"] if os.environ.get("TINYEXT_LOCAL_VERSION") else ""),
    packages=["tinyext"],
    ext_modules=[
        CUDAExtension(
            "tinyext_cuda",
            ["csrc/ext.cpp", "csrc/kernel_a.cu", "csrc/kernel_b.cu"],
            extra_compile_args={"cxx": ["-O1"], "nvcc": nvcc},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
)
