"""A cibuildwheel configuration per cell, exported for projects whose CI runs cibuildwheel (`attnforge ci cibuildwheel`).

`cibuildwheel_config(cell)` returns the `[tool.cibuildwheel]` table as a dict; `to_toml()` writes it as
a file for `cibuildwheel --platform linux --config-file FILE SOURCE_DIR` (`attnforge ci cibuildwheel
--cell ID`). It is attnforge's cell exported for a project whose CI already runs cibuildwheel (stock
manylinux_2_28 image, toolkit via dnf, torch from PyTorch's index): upstream's setup.py knobs only, so the
caveats written into the file say what attnforge's own builder does beyond it (patches, head-dim/dtype
subsets, kernel objects shared across Pythons). attnforge itself builds through its one builder.
What cibuildwheel's Linux container mode needs (read from pypa/cibuildwheel 4.x, oci_container.py,
platforms/linux.py and docs/options.md):

- a Docker (API >= 1.41, i.e. 20.10+) or Podman (>= 3) engine; it runs `docker create --platform=... --pull=...`
  and pulls only when the image is not already local for the right platform (`--pull=never` then), so a
  locally built image works offline;
- an image laid out like manylinux: Pythons in `/opt/python/cpXY-cpXY`, a helper Python at
  `/opt/python/cp39-cp39/bin/python`, `auditwheel` on PATH and `AUDITWHEEL_PLAT` set
  (docker/manylinux-cuda.Dockerfile builds one locally; quay.io/pypa/manylinux_2_28_x86_64 is unreachable here);
- `container-engine = {name, create-args, disable-host-mount}` passes extra `docker create` flags (mounts,
  `--network`, `--memory`); the host root is mounted at /host unless `disable-host-mount` is true;
- `before-all` runs once per container (toolkit), `before-build` once per Python (torch: the build imports
  it, so the frontend must not isolate the build: `pip; args: --no-build-isolation --use-pep517`, the same
  `pip wheel` line as attnforge's own builder).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from attnforge.core.errors import ConfigurationError
from attnforge.matrix.cell import Cell
from attnforge.wheels.finalize import TORCH_PROVIDED_LIBS

MANYLINUX = "manylinux_2_28"
# auditwheel --exclude patterns: torch's and the CUDA/ROCm runtime's libraries come with the torch wheel
# at run time (`wheels finalize` excludes the same list); each cell gets torch's plus its toolkit's.
CUDA_LIB_PREFIXES = ("libcu", "libnv", "libnccl")
ROCM_LIB_PREFIXES = ("libamdhip", "libhip", "libroc", "libMIOpen", "librccl", "libaotriton", "libhsa")


def repair_excludes(kind: str) -> list[str]:
    """TORCH_PROVIDED_LIBS without the other toolkit's names (`kind`: cuda or rocm)."""
    other = ROCM_LIB_PREFIXES if kind == "cuda" else CUDA_LIB_PREFIXES
    extra = ["libhsa-runtime64.so*"] if kind == "rocm" else []
    return [p for p in TORCH_PROVIDED_LIBS if not p.startswith(other)] + extra


CUDA_PIP_PACKAGES = [
    "nvidia-cuda-nvcc",
    "nvidia-cuda-runtime",
    "nvidia-cuda-cccl",
    "nvidia-cuda-crt",
    "nvidia-nvvm",
]
# What attnforge's builder installs beside torch (builder.torchenv): setup.py imports
# packaging and wheel; psutil is only needed when MAX_JOBS is unset, and MAX_JOBS is always set here.
BUILD_REQUIREMENTS = ("setuptools>=77", "wheel", "packaging", "ninja")
FRONTEND = "pip; args: --no-build-isolation --use-pep517"
IMPORT_MARKER = "attnforge-import-check"


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


def _check_env_value(key: str, value: str) -> None:
    """cibuildwheel wraps each table value in double quotes and evaluates it like bash."""
    if key != "PATH" and re.search(r'["$`\\]', value):
        raise ConfigurationError(f"environment {key}={value!r}: quotes, $, ` and \\ are not passed through")


def _environment(
    cell: Cell, max_jobs: int | None, nvcc_threads: int | None, env: Mapping[str, str]
) -> dict[str, str]:
    tk = cell.toolkit
    out: dict[str, str] = {
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
        "FLASH_ATTENTION_FORCE_CXX11_ABI": "TRUE" if cell.cxx11_abi else "FALSE",
        "FLASH_ATTN_LOCAL_VERSION": cell.local_version,
    }
    if max_jobs:
        out["MAX_JOBS"] = str(max_jobs)
    if nvcc_threads:
        out["NVCC_THREADS"] = str(nvcc_threads)
    if tk.kind == "cuda":
        home = f"/usr/local/cuda-{tk.version}"
        out.update(
            {
                "BUILD_TARGET": "cuda",
                "CUDA_HOME": home,
                "PATH": f"{home}/bin:$PATH",
                "FLASH_ATTN_CUDA_ARCHS": arch_numbers(cell.arches),
            }
        )
        flags = cell.compile_flags()
        if flags:
            out["NVCC_APPEND_FLAGS"] = " ".join(flags)
    else:
        out.update({"BUILD_TARGET": "rocm", "GPU_ARCHS": ";".join(cell.arches), "ROCM_HOME": "/opt/rocm"})
        if cell.profile_spec.rocm_backend == "triton":
            out["FLASH_ATTENTION_TRITON_AMD_ENABLE"] = "TRUE"
    out.update(env)
    for key, value in out.items():
        _check_env_value(key, value)
    return out


def repair_command(excludes: Sequence[str], plat: str | None) -> str:
    """`auditwheel repair` excluding torch-provided libraries; without `plat`, the image's AUDITWHEEL_PLAT."""
    parts = ["auditwheel", "repair"]
    for lib in excludes:
        parts += ["--exclude", shlex.quote(lib)]
    if plat:
        parts += ["--plat", plat]
    return " ".join([*parts, "-w", "{dest_dir}", "{wheel}"])


def cibuildwheel_config(
    cell: Cell,
    *,
    image: str | None = None,
    toolkit_source: str | None = None,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    create_args: Sequence[str] = (),
    index_url: str | None = None,
    pip_env: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    disable_host_mount: bool = False,
) -> dict[str, Any]:
    """The `[tool.cibuildwheel]` table that builds exactly this cell's wheel.

    `image`: a manylinux-style image that carries the toolkit (then `toolkit_source` defaults to 'image');
    without one, the pinned manylinux_2_28 image and a `dnf` toolkit install. `max_jobs`/`nvcc_threads`
    come from the engine's `resolve_settings` (nothing is guessed here). `index_url` replaces PyPI
    and PyTorch's index for torch; `pip_env` (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_CONSTRAINT, ...) instead
    configures every pip in the container (before-build and the test venv: air-gapped mirrors). `env` is
    applied last.
    """
    if cell.kernel != "flash-attn":
        raise ConfigurationError(
            f"{cell.id}: the cibuildwheel export maps flash-attn (FA2) cells only; build {cell.kernel} with "
            "`attnforge build` (`attnforge docs fa3`)"
        )
    if cell.platform != "x86_64":
        raise ConfigurationError(f"{cell.id}: only x86_64 cells are mapped to cibuildwheel so far")
    tk = cell.toolkit
    source = toolkit_source or ("image" if image else "dnf")
    if tk.kind == "rocm" and not image:
        raise ConfigurationError(f"{cell.id}: ROCm cells need an image that carries ROCm {tk.version}")
    # the stock image targets manylinux_2_28; another image gets the best tag its glibc symbols allow
    # (auditwheel's `auto`, what `wheels finalize` picks too), not its AUDITWHEEL_PLAT plus that tag
    plat = "auto" if image else f"{MANYLINUX}_{cell.platform}"
    torch_pin = f"torch=={cell.torch}"
    environment = _environment(cell, max_jobs, nvcc_threads, {**(pip_env or {}), **(env or {})})
    build_reqs = " ".join(shlex.quote(r) for r in BUILD_REQUIREMENTS)
    index = index_url or torch_index(cell)
    if pip_env is not None:  # every pip in the container is configured by PIP_* (mirrors)
        before_build = f"pip install {shlex.quote(torch_pin)} {build_reqs}"
    else:
        before_build = f"pip install --index-url {index} {shlex.quote(torch_pin)} && pip install {build_reqs}"
    config: dict[str, Any] = {
        "build": f"{cell.cp}-manylinux_{cell.platform}",  # cp314t: cibuildwheel's free-threaded identifier
        "archs": [cell.platform],
        "build-frontend": FRONTEND,
        f"manylinux-{cell.platform}-image": image or MANYLINUX,
        "before-all": _toolkit_install(cell, source) if tk.kind == "cuda" else "hipcc --version",
        "before-build": before_build,
        "environment": environment,
        "repair-wheel-command": repair_command(repair_excludes(tk.kind), plat),
        "test-requires": [torch_pin],
        "test-command": (
            'python -c "import torch, flash_attn, flash_attn_2_cuda; '
            f"print('{IMPORT_MARKER}', flash_attn.__version__, torch.__version__)\""
        ),
        "build-verbosity": 1,
    }
    if pip_env is None:
        config["test-environment"] = {
            "PIP_INDEX_URL": index,
            "PIP_EXTRA_INDEX_URL": "https://pypi.org/simple",
        }
    if create_args or disable_host_mount:
        engine: dict[str, Any] = {"name": "docker", "create-args": list(create_args)}
        if disable_host_mount:
            engine["disable-host-mount"] = True
        config["container-engine"] = engine
    return config


def caveats(cell: Cell) -> list[str]:
    """What this config alone cannot do for the cell, which attnforge's own builder does."""
    notes: list[str] = []
    if cell.patches:
        notes.append(
            f"needs attnforge's source patches ({', '.join(cell.patches)}): cibuildwheel builds the raw sdist"
        )
    spec = cell.profile_spec
    if spec.head_dims is not None or spec.dtypes is not None:
        notes.append(
            "head-dim/dtype subsets are attnforge's dispatch-subset patch and unit list, not an env var: "
            "this config compiles every head dim and dtype"
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
