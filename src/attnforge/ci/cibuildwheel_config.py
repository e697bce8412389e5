"""A cibuildwheel configuration per cell (research for a `cibuildwheel` backend; the lead integrates it).

`cibuildwheel_config(cell)` returns the `[tool.cibuildwheel]` table as a dict; `to_toml()` writes it as
a file for `cibuildwheel --config-file FILE --platform linux SOURCE_DIR`. What cibuildwheel's Linux
container mode needs (read from pypa/cibuildwheel 4.x, oci_container.py and docs/options.md):

- a Docker (API >= 1.41, i.e. 20.10+) or Podman (>= 3) engine; it runs `docker create --platform=... --pull=...`
  and pulls only when the image is not already local for the right platform (`--pull=never` then), so a
  locally built or imported image works offline;
- an image laid out like manylinux: Pythons in `/opt/python/cpXY-cpXY`, `auditwheel` on PATH and
  `AUDITWHEEL_PLAT` set; the default images (quay.io/pypa/manylinux_2_28_x86_64) are unreachable here;
- `container-engine = "docker; create_args: ..."` passes extra `docker create` flags (e.g. `--gpus all`,
  a CA bundle mount); the host root is mounted at /host unless `disable_host_mount: true`;
- `before-all` runs once per container (toolkit install), `before-build` once per Python (torch: the
  build imports it, so the frontend must not isolate the build: `build; args: --no-isolation`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..cell import Cell
from ..errors import ConfigurationError

MANYLINUX = "manylinux_2_28"
TORCH_LIBS = [
    "libtorch.so",
    "libc10.so",
    "libc10_cuda.so",
    "libtorch_cpu.so",
    "libtorch_cuda.so",
    "libtorch_python.so",
]
CUDA_LIBS = ["libcudart.so.*", "libcuda.so.*", "libcublas.so.*", "libcublasLt.so.*", "libnvrtc.so.*"]
ROCM_LIBS = ["libamdhip64.so.*", "libhsa-runtime64.so.*", "libc10_hip.so", "libtorch_hip.so"]
CUDA_PIP_PACKAGES = [
    "nvidia-cuda-nvcc",
    "nvidia-cuda-runtime",
    "nvidia-cuda-cccl",
    "nvidia-cuda-crt",
    "nvidia-nvvm",
]
BUILD_DEPS = "setuptools wheel ninja packaging psutil einops"


def arch_numbers(arches: tuple[str, ...]) -> str:
    """('sm_80', 'sm_90a') -> '80;90a' (FLASH_ATTN_CUDA_ARCHS)."""
    nums = []
    for a in arches:
        m = re.fullmatch(r"sm_(\d+)([af]?)", a)
        if not m:
            raise ConfigurationError(f"{a}: not a CUDA arch (expected like sm_90)")
        nums.append(m.group(1) + m.group(2))
    return ";".join(nums)


def torch_index(cell: Cell) -> str:
    """PyTorch's per-variant wheel index for the cell's torch build (cu130, rocm6.4)."""
    return f"https://download.pytorch.org/whl/{cell.torch_variant or cell.toolkit.short}"


def _toolkit_install(cell: Cell, toolkit_source: str) -> str:
    tk = cell.toolkit
    dashed = tk.version.replace(".", "-")
    if toolkit_source == "image":
        return f"nvcc --version && test -d /usr/local/cuda-{tk.version}"
    if toolkit_source == "pypi":
        if tk.major < 13:
            raise ConfigurationError(
                f"{tk}: PyPI's nvidia-cuda-nvcc-cu12 has no nvcc; use toolkit_source 'dnf' or 'image'"
            )
        # the recipe of docker/cuda-builder.Dockerfile (CUDA_FROM=pypi): wheels into /opt/cuda-pypi
        reqs = " ".join(f"'{p}=={tk.version}.*'" for p in CUDA_PIP_PACKAGES)
        root = f"/opt/cuda-pypi/nvidia/cu{tk.major}"
        return (
            f"/opt/python/cp312-cp312/bin/pip install --no-deps --only-binary=:all: --target /opt/cuda-pypi {reqs}"
            f" && ln -sfn {root} /usr/local/cuda-{tk.version}"
            f" && (test -e {root}/lib64 || ln -s lib {root}/lib64)"
            f" && (test -e {root}/lib/libcudart.so || ln -s libcudart.so.{tk.major} {root}/lib/libcudart.so)"
            f" && /usr/local/cuda-{tk.version}/bin/nvcc --version"
        )
    if toolkit_source == "dnf":
        return (
            "dnf install -y dnf-plugins-core && dnf config-manager --add-repo "
            "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo && "
            f"dnf install -y cuda-nvcc-{dashed} cuda-cudart-devel-{dashed} cuda-libraries-devel-{dashed} "
            f"cuda-nvrtc-devel-{dashed} && dnf clean all"
        )
    raise ConfigurationError(f"toolkit_source {toolkit_source!r}: expected image, dnf or pypi")


def cibuildwheel_config(
    cell: Cell,
    *,
    image: str | None = None,
    toolkit_source: str | None = None,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    create_args: tuple[str, ...] = (),
    index_url: str | None = None,
) -> dict[str, Any]:
    """The `[tool.cibuildwheel]` table that builds exactly this cell's wheel.

    `image`: a manylinux-style image that carries the toolkit (then `toolkit_source` defaults to 'image');
    without one, the pinned manylinux_2_28 image and a `dnf` toolkit install. `max_jobs`/`nvcc_threads`
    come from the engine's `choose_parallelism` (nothing is guessed here). `index_url` replaces PyPI
    and PyTorch's index for torch (air-gapped mirrors).
    """
    if cell.platform != "x86_64":
        raise ConfigurationError(f"{cell.id}: only x86_64 cells are mapped to cibuildwheel so far")
    tk = cell.toolkit
    source = toolkit_source or ("image" if image else "dnf")
    if tk.kind == "rocm" and not image:
        raise ConfigurationError(f"{cell.id}: ROCm cells need an image that carries ROCm {tk.version}")
    env: dict[str, str] = {
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
        "FLASH_ATTENTION_FORCE_CXX11_ABI": "TRUE" if cell.cxx11_abi else "FALSE",
        "FLASH_ATTN_LOCAL_VERSION": cell.local_version,
    }
    if max_jobs:
        env["MAX_JOBS"] = str(max_jobs)
    if nvcc_threads:
        env["NVCC_THREADS"] = str(nvcc_threads)
    if tk.kind == "cuda":
        home = f"/usr/local/cuda-{tk.version}"
        env.update(
            {
                "BUILD_TARGET": "cuda",
                "CUDA_HOME": home,
                "PATH": f"{home}/bin:$PATH",
                "FLASH_ATTN_CUDA_ARCHS": arch_numbers(cell.arches),
            }
        )
        flags = cell.compile_flags()
        if flags:
            env["NVCC_APPEND_FLAGS"] = " ".join(flags)
    else:
        env.update({"BUILD_TARGET": "rocm", "GPU_ARCHS": ";".join(cell.arches), "ROCM_HOME": "/opt/rocm"})
        if cell.profile_spec.rocm_backend == "triton":
            env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] = "TRUE"
    torch_pin = f"torch=={cell.torch}"
    index = index_url or torch_index(cell)
    excludes = TORCH_LIBS + (CUDA_LIBS if tk.kind == "cuda" else ROCM_LIBS)
    repair = (
        "auditwheel repair "
        + " ".join(f"--exclude {lib}" for lib in excludes)
        + f" --plat {MANYLINUX}_x86_64 -w {{dest_dir}} {{wheel}}"
    )
    config: dict[str, Any] = {
        "build": f"{cell.cp}-manylinux_x86_64",
        "archs": ["x86_64"],
        "build-frontend": "build; args: --no-isolation",
        "manylinux-x86_64-image": image or MANYLINUX,
        "before-all": _toolkit_install(cell, source) if tk.kind == "cuda" else "hipcc --version",
        "before-build": f"pip install --index-url {index} '{torch_pin}' && pip install {BUILD_DEPS}",
        "environment": env,
        "repair-wheel-command": repair,
        "test-requires": [torch_pin],
        "test-environment": {"PIP_INDEX_URL": index, "PIP_EXTRA_INDEX_URL": "https://pypi.org/simple"},
        "test-command": (
            'python -c "import torch, flash_attn, flash_attn_2_cuda; '
            'print(flash_attn.__version__, torch.__version__)"'
        ),
        "build-verbosity": 1,
    }
    if create_args:
        config["container-engine"] = {"name": "docker", "create-args": list(create_args)}
    return config


def caveats(cell: Cell) -> list[str]:
    """What this config alone cannot do for the cell (the integration has to prepare the source tree)."""
    notes: list[str] = []
    if cell.patches:
        notes.append(
            f"needs attnforge's source patches ({', '.join(cell.patches)}): point cibuildwheel at the tree "
            "attnforge prepared, not the raw sdist"
        )
    spec = cell.profile_spec
    if spec.head_dims is not None or spec.dtypes is not None:
        notes.append(
            "head-dim/dtype subsets are attnforge's dispatch-subset patch and unit list, not an env var: "
            "use the prepared tree"
        )
    if spec.disable:
        notes.append(
            "FLASHATTENTION_DISABLE_* reach nvcc through NVCC_APPEND_FLAGS only; flash_api.cpp (g++) needs "
            "them too (attnforge's setup hook adds them)"
        )
    notes.append(
        "one cibuildwheel run per cell compiles the kernels again for every Python: attnforge's engine "
        "reuses them per kernel-set key, cibuildwheel does not"
    )
    return notes


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def to_toml(config: dict[str, Any], cell: Cell | None = None) -> str:
    """The config as a `--config-file` (a `[tool.cibuildwheel]` table), keys in a stable order."""
    head = [f"# cibuildwheel config for {cell.id}" if cell else "# cibuildwheel config (attnforge)"]
    head.append(
        "# generated by attnforge.ci.cibuildwheel_config; run: cibuildwheel --platform linux --config-file THIS SRC"
    )
    if cell:
        head.extend(f"# caveat: {note}" for note in caveats(cell))
    lines = [*head, "[tool.cibuildwheel]"]
    lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in config.items())
    return "\n".join(lines) + "\n"
