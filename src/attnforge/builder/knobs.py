"""The environment a kernel's setup.py builds under: flash-attn's knobs, the setup hook's, FlashAttention-3's
switches, the toolkit's, ccache's, and the ROCm backends' (CK, Triton). Every knob comes from a spec field;
nothing else is read."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from .cross import cross_env, is_cross
from .exits import EXIT_CONFIG, BuildFailure
from .report import Reporter
from .spec import BuildSpec
from .torchenv import pip_env, run_capture

# Variables that steer a CUDA build or another ROCm backend: removed before a ROCm build's knobs are set
# (a leftover GPU_ARCHS or TRITON switch would change the wheel).
ROCM_ENV_TO_CLEAR: tuple[str, ...] = (
    "FLASH_ATTN_CUDA_ARCHS",
    "TORCH_CUDA_ARCH_LIST",
    "NVCC_APPEND_FLAGS",
    "NVCC_THREADS",
    "GPU_ARCHS",
    "PYTORCH_ROCM_ARCH",
    "OPT_DIM",
    "FLASH_ATTENTION_SKIP_CK_BUILD",
    "FLASH_ATTENTION_TRITON_AMD_ENABLE",
    "FLASH_ATTENTION_SKIP_CUDA_BUILD",
)
TRITON_IMPORT_ENV = {
    "FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"
}  # what `import flash_attn` needs at run time


def arch_numbers(arches: list[str]) -> list[str]:
    """["sm_90", "sm_100a"] -> ["90", "100a"]."""
    out = []
    for a in arches:
        m = re.fullmatch(r"(?:sm_|compute_)?(\d+)([af]?)", str(a))
        if not m:
            raise BuildFailure(EXIT_CONFIG, f"unknown CUDA arch {a!r} (expected like sm_90)")
        out.append(m.group(1) + m.group(2))
    return out


def torch_arch_list(nums: list[str]) -> str:
    """["90", "100a"] -> "9.0 10.0a"."""
    out = []
    for n in nums:
        digits = n.rstrip("af")
        out.append(f"{digits[:-1]}.{digits[-1]}{n[len(digits) :]}")
    return " ".join(out)


def rocm_common_env(local_version: str, cxx11_abi: bool) -> dict[str, str]:
    """What every ROCm build of flash-attn sets (BUILD_TARGET=rocm: setup.py's ROCm branch, any torch)."""
    return {
        "BUILD_TARGET": "rocm",
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
        "FLASH_ATTENTION_SKIP_CUDA_BUILD": "FALSE",
        "FLASH_ATTENTION_FORCE_CXX11_ABI": "TRUE" if cxx11_abi else "FALSE",
        "FLASH_ATTN_LOCAL_VERSION": local_version,
    }


def ck_env(*, gpu_archs: str, max_jobs: int, local_version: str, cxx11_abi: bool) -> dict[str, str]:
    """The CK build: hipcc compiles Composable Kernel for exactly ``gpu_archs``."""
    return {
        **rocm_common_env(local_version, cxx11_abi),
        "FLASH_ATTENTION_TRITON_AMD_ENABLE": "FALSE",
        "GPU_ARCHS": gpu_archs,
        "PYTORCH_ROCM_ARCH": gpu_archs,
        "MAX_JOBS": str(max(1, max_jobs)),
    }


def triton_env(*, local_version: str, cxx11_abi: bool) -> dict[str, str]:
    """The Triton build: no extension, Python files only (the kernels are JIT-compiled on the GPU later)."""
    return {
        **rocm_common_env(local_version, cxx11_abi),
        "FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE",
        "FLASH_ATTENTION_SKIP_CK_BUILD": "TRUE",
        "MAX_JOBS": "1",
    }


def flash_attn_env(spec: BuildSpec, nums: list[str], prebuilt: Path | None) -> dict[str, str]:
    """flash-attn 2's setup.py knobs and the setup hook's (profile pruning, macros, objects, unit order)."""
    env = {
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
        "FLASH_ATTENTION_SKIP_CUDA_BUILD": "FALSE",
        "BUILD_TARGET": "cuda",
        "FLASH_ATTENTION_FORCE_CXX11_ABI": "TRUE" if spec.cxx11_abi else "FALSE",
        "ATTNFORGE_DEFINES": " ".join(f"-DFLASHATTENTION_DISABLE_{d.upper()}" for d in spec.disable),
        "ATTNFORGE_HEAD_DIMS": ",".join(str(d) for d in (spec.head_dims or [])),
        "ATTNFORGE_DTYPES": ",".join(spec.dtypes or []),
        "ATTNFORGE_PROFILE": spec.profile or "",
        "ATTNFORGE_DROP_BACKWARD": "0" if spec.backward else "1",
        "ATTNFORGE_PREBUILT_OBJECTS": str(prebuilt) if prebuilt else "",
        "ATTNFORGE_UNIT_SECONDS": ",".join(f"{k}={v:g}" for k, v in sorted(spec.unit_seconds.items())),
        # the arch policy's -gencode pairs replace setup.py's (family targets, embedded PTX); empty: keep them
        "ATTNFORGE_GENCODE": ";".join(spec.gencode),
    }
    if nums:
        env["FLASH_ATTN_CUDA_ARCHS"] = ";".join(nums)
    if spec.local_version:
        env["FLASH_ATTN_LOCAL_VERSION"] = spec.local_version
    return env


# hopper/setup.py's FLASH_ATTENTION_DISABLE_<X> switches (all of them, set TRUE or FALSE on every build so a
# variable left in the caller's environment cannot change the wheel) and its head dims. The same names as
# attnforge's kernels.json (`features`, `head_dims` of flash-attn-3); a unit test keeps them equal.
FA3_HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 192, 256)
FA3_FEATURES: tuple[str, ...] = (
    "backward",
    "split",
    "pagedkv",
    "appendkv",
    "local",
    "softcap",
    "packgqa",
    "varlen",
    "cluster",
    "sm80",
    "hdimdiff64",
    "hdimdiff192",
)
FA3_SWITCHES: tuple[str, ...] = (
    *(f.upper() for f in FA3_FEATURES),
    "FP16",
    "FP8",
    *(f"HDIM{d}" for d in FA3_HEAD_DIMS),
)
FA3_ARCHES = {"80": "sm_80", "90a": "sm_90a"}  # what hopper/setup.py compiles: sm_90a always, sm_80 optional


def fa3_disabled(spec: BuildSpec, nums: list[str]) -> list[str]:
    """The FLASH_ATTENTION_DISABLE_<X> switches a spec turns on (``fa3_switches``)."""
    return fa3_switches(list(spec.disable), spec.head_dims, spec.dtypes, nums)


def fa3_switches(
    disable: list[str], head_dims: list[int] | None, dtypes: list[str] | None, nums: list[str]
) -> list[str]:
    """The FLASH_ATTENTION_DISABLE_<X> switches for a profile: its ``disable`` features, the head dims and
    dtypes it leaves out (a left-out 64 or 192 also drops the 64x256/64x512 and 192x128 V-dim variants), and
    SM80 unless sm_80 ("80") is among the arch numbers. BuildFailure(EXIT_CONFIG) for what FA3 cannot do.
    The parity suite sets the same variables for upstream's tests."""
    unknown = [f for f in disable if f not in FA3_FEATURES]
    if unknown:
        raise BuildFailure(
            EXIT_CONFIG,
            f"flash-attn-3 has no switch for {', '.join(unknown)} (features: {', '.join(FA3_FEATURES)})",
        )
    bad = [n for n in nums if n not in FA3_ARCHES]
    if bad or "90a" not in nums:
        raise BuildFailure(
            EXIT_CONFIG,
            f"flash-attn-3 compiles sm_90a (always) and sm_80 (optional), not "
            f"{', '.join('sm_' + n for n in nums) or 'no arch'}",
        )
    off = {f.upper() for f in disable}
    if head_dims is not None:
        dims = set(head_dims)
        if not dims <= set(FA3_HEAD_DIMS):
            raise BuildFailure(EXIT_CONFIG, f"flash-attn-3 head dims are {FA3_HEAD_DIMS}, not {sorted(dims)}")
        off |= {f"HDIM{d}" for d in FA3_HEAD_DIMS if d not in dims}
        off |= {f"HDIMDIFF{d}" for d in (64, 192) if d not in dims}
    if dtypes is not None:
        if "bf16" not in dtypes or not set(dtypes) <= {"bf16", "fp16", "fp8"}:
            raise BuildFailure(
                EXIT_CONFIG, f"flash-attn-3 always compiles bf16 (fp16 and fp8 optional), not dtypes {dtypes}"
            )
        off |= {name for name, dt in (("FP16", "fp16"), ("FP8", "fp8")) if dt not in dtypes}
    if "80" not in nums:
        off.add("SM80")
    return sorted(off)


def flash_attn3_env(spec: BuildSpec, nums: list[str]) -> dict[str, str]:
    """FlashAttention-3's hopper/setup.py knobs: compile (never fetch a wheel), every switch set."""
    off = fa3_disabled(spec, nums)
    env = {
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
        "FLASH_ATTENTION_SKIP_CUDA_BUILD": "FALSE",
        "FLASH_ATTENTION_TRITON_AMD_ENABLE": "FALSE",
        "BUILD_TARGET": "cuda",
        "FLASH_ATTENTION_FORCE_CXX11_ABI": "TRUE" if spec.cxx11_abi else "FALSE",
        "FLASH_ATTENTION_ENABLE_VCOLMAJOR": "FALSE",
    }
    env.update({f"FLASH_ATTENTION_DISABLE_{s}": "TRUE" if s in off else "FALSE" for s in FA3_SWITCHES})
    if spec.local_version:
        env["FLASH_ATTN_LOCAL_VERSION"] = spec.local_version
    return env


def cuda_home(env: dict[str, str]) -> str | None:
    """CUDA_HOME, else /usr/local/cuda when it exists."""
    return env.get("CUDA_HOME") or ("/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None)


def build_env(
    spec: BuildSpec,
    vpy: str | None,
    tree: Path,
    epoch: int,
    max_jobs: int,
    prebuilt: Path | None,
    auto_wrap: bool = False,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of ``pip wheel`` for this spec (``vpy`` None: before the venv exists, for the
    kernel lane; ``base``: the environment to start from, default this process's)."""
    base = dict(os.environ if base is None else base)
    if spec.pure_python:
        base = {k: v for k, v in base.items() if k not in ROCM_ENV_TO_CLEAR}
    env = pip_env(spec, base)
    home = cuda_home(env)
    path = [str(Path(vpy).parent)] if vpy else []
    if home and not spec.pure_python:
        env["CUDA_HOME"] = home
        path.append(os.path.join(home, "bin"))
    env["PATH"] = os.pathsep.join([*path, env.get("PATH", "/usr/bin:/bin")])
    env["SOURCE_DATE_EPOCH"] = str(int(epoch))
    env["PIP_NO_INPUT"] = "1"
    if spec.pure_python:
        env.update(triton_env(local_version=spec.local_version or "", cxx11_abi=spec.cxx11_abi))
        env.update({str(k): str(v) for k, v in spec.env.items()})
        return env
    env["MAX_JOBS"] = str(max_jobs)
    env["NVCC_THREADS"] = str(spec.nvcc_threads)
    nums = arch_numbers(list(spec.arches))
    if nums:
        env["TORCH_CUDA_ARCH_LIST"] = torch_arch_list(nums)
    if spec.nvcc_append_flags:
        env["NVCC_APPEND_FLAGS"] = spec.nvcc_append_flags
    if spec.kernel == "flash-attn":
        env.update(flash_attn_env(spec, nums, prebuilt))
    elif spec.kernel == "flash-attn-3":
        env.update(flash_attn3_env(spec, nums))
    if spec.ccache_dir and shutil.which("ccache", path=env["PATH"]):
        env.update(
            {
                "CCACHE_DIR": spec.ccache_dir,
                "CCACHE_MAXSIZE": "20G",
                "CCACHE_BASEDIR": str(tree),
                "CCACHE_NOHASHDIR": "true",
                "CCACHE_COMPILERCHECK": "content",
            }
        )
        if not auto_wrap and home:
            # Older torch: wrap nvcc ourselves (CXX="ccache c++" would fail torch's compiler version check).
            env["PYTORCH_NVCC"] = "ccache " + os.path.join(home, "bin", "nvcc")
    else:
        # torch >= 2.14 prepends ccache/sccache by itself when one is on PATH, with the default cache dir
        # (inside a --rm container: thrown away); attnforge decides: no spec.ccache_dir, no wrapper.
        env["TORCH_NO_COMPILER_WRAPPER"] = "1"
    if vpy and is_cross(spec):  # (no venv yet: the kernel lane, which cross builds do not run)
        env.update(cross_env(spec, vpy, env, Reporter(None)))  # its lines to stdout: the host logs them
    env.update({str(k): str(v) for k, v in spec.env.items()})
    return env


def ccache_stats(env: dict[str, str]) -> dict[str, int]:
    """ccache's counters (hits, misses, uncacheable) for ``CCACHE_DIR``; empty when ccache is not in use."""
    if "CCACHE_DIR" not in env:
        return {}
    try:
        out = run_capture(["ccache", "--print-stats"], env=env, timeout=60)
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return {}
    raw: dict[str, int] = {}
    for line in out.splitlines():
        key, _, value = line.partition("\t")
        if value.strip().isdigit():
            raw[key] = int(value)
    return {
        "hits": raw.get("direct_cache_hit", 0) + raw.get("preprocessed_cache_hit", 0),
        "misses": raw.get("cache_miss", 0),
        "uncacheable": sum(
            v for k, v in raw.items() if k.startswith(("unsupported", "could_not", "compiler_"))
        ),
    }
