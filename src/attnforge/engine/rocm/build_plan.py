"""The exact build environment of a ROCm cell: flash-attn's setup.py knobs for the CK and Triton backends.

What flash-attn 2.8.3's setup.py does with them (read from the sdist, and for Triton run here):

- ``BUILD_TARGET``: ``auto`` takes the ROCm branch only when torch is a HIP build (``IS_HIP_EXTENSION``);
  ``rocm`` forces it. A Triton build against a CPU or CUDA torch needs ``rocm``: under ``auto`` setup.py
  takes the CUDA branch (cutlass, nvcc, ``CUDA_HOME``) and fails or compiles CUDA.
- ``FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE``: ``FLASH_ATTENTION_SKIP_CK_BUILD`` defaults to TRUE, no
  extension module is declared, so the wheel is pure Python (``py3-none-any``).
- ``FLASH_ATTENTION_FORCE_BUILD=TRUE``: without it ``bdist_wheel`` first guesses a GitHub release URL, which
  for ROCm calls ``torch.version.hip.split()``: an AttributeError on any torch that is not a HIP build.
- ``GPU_ARCHS``: ``;``-separated, checked against native/gfx90a/gfx942/gfx950. The default ``native`` asks
  ``torch.cuda.get_device_properties("cuda").gcnArchName``: a GPU at build time. Builders have none.
- ``MAX_JOBS``: torch's ninja build reads it. ``NVCC_THREADS`` is not used by the CK branch.
- The CK branch passes ``--offload-arch`` itself, so torch adds only ``-fno-gpu-rdc`` (``PYTORCH_ROCM_ARCH``
  is set to the same list anyway, for tools that read it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from attnforge.builder.knobs import TRITON_IMPORT_ENV, ck_env, triton_env
from attnforge.builder.settings import BuildSettings
from attnforge.core.errors import ConfigurationError
from attnforge.engine.resources import JobMemoryTable, Machine, detect_machine
from attnforge.engine.settings import Requested, resolve_settings
from attnforge.matrix.cell import Cell
from attnforge.matrix.compat import CompatData
from attnforge.matrix.schema import ResourcesSpec

Backend = Literal["ck", "triton"]

# flash-attn 2.8.x setup.py validate_and_update_archs, minus "native" (compat.toml ck_gfx overrides).
CK_GFX_DEFAULT: tuple[str, ...] = ("gfx90a", "gfx942", "gfx950")
TORCH_INDEX_URL = "https://download.pytorch.org/whl/{name}"


def is_rocm(cell: Cell) -> bool:
    """True for a cell on a ROCm toolkit."""
    return cell.toolkit.kind == "rocm"


def backend_of(cell: Cell) -> Backend:
    """The cell's ROCm backend: the profile's `rocm_backend`, CK when unset (as the `profile` rule does)."""
    if not is_rocm(cell):
        raise ConfigurationError(f"{cell.id}: {cell.toolkit} is not a ROCm toolkit")
    return cell.profile_spec.rocm_backend or "ck"


def ck_allowed_gfx(cell: Cell, data: CompatData | None = None) -> tuple[str, ...]:
    """The gfx targets flash-attn's CK build accepts for this kernel version (compat data, else 2.8.x's)."""
    row = data.kernel_release(cell.kernel, cell.kernel_version) if data else None
    return tuple(row.ck_gfx) if row and row.ck_gfx else CK_GFX_DEFAULT


def gpu_archs_value(arches: tuple[str, ...] | list[str], allowed: tuple[str, ...] = CK_GFX_DEFAULT) -> str:
    """`GPU_ARCHS` for CK ("gfx90a;gfx942"); refuses empty, `native` and targets CK cannot compile."""
    if not arches:
        raise ConfigurationError("a CK build needs its gfx arches named (GPU_ARCHS); the cell has none")
    if "native" in arches:
        raise ConfigurationError(
            "GPU_ARCHS=native asks the build machine's GPU and builders have none: name the arches "
            f"(one of {', '.join(allowed)})"
        )
    bad = [a for a in arches if a not in allowed]
    if bad:
        raise ConfigurationError(
            f"flash-attn's CK backend cannot compile for {', '.join(bad)} (it accepts {', '.join(allowed)})"
        )
    return ";".join(arches)


def unsupported_profile_knobs(cell: Cell) -> list[str]:
    """Profile fields a ROCm build cannot honour: the DISABLE macros and kernel pruning are CUDA-source ones."""
    spec = cell.profile_spec
    out = []
    if spec.disable:
        out.append("disable (FLASHATTENTION_DISABLE_* exist in the CUDA sources only)")
    if spec.head_dims is not None:
        out.append("head_dims (attnforge prunes CUDA kernel units only)")
    if spec.dtypes is not None:
        out.append("dtypes (attnforge prunes CUDA kernel units only)")
    return out


def rocm_parallelism(
    cell: Cell,
    *,
    machine: Machine | None = None,
    table: JobMemoryTable | None = None,
    max_jobs: int | None = None,
    resources: ResourcesSpec | None = None,
    reserve_gb: float | None = None,
    share: int = 1,
) -> BuildSettings:
    """A ROCm cell's settings from the one resolver (`engine.settings`); Triton compiles nothing, so 1 job.

    hipcc compiles a unit's offload arches one after the other (no --threads like nvcc), so a job's
    memory is one arch's: the resolver gives it threads=1 (the per-arch figure is `rocmX.x/full`).
    """
    return resolve_settings(
        cell,
        resources or ResourcesSpec(),
        Requested.of(max_jobs),
        machine=machine or detect_machine(),
        table=table or JobMemoryTable(),
        reserve_gb=reserve_gb,
        share=share,
    )


def torch_index_name(cell: Cell, data: CompatData | None = None) -> str:
    """PyTorch's index for the cell's ROCm variant: `rocm6.4`, or the exact name where it differs (`rocm6.2.4`)."""
    name = f"rocm{cell.toolkit.version}"
    row = data.torch_release(cell.torch) if data else None
    extra = (row.model_extra or {}) if row else {}
    for exact in extra.get("rocm_index", []) or []:
        if str(exact) == name or str(exact).startswith(name + "."):
            return str(exact)
    return name


@dataclass(frozen=True)
class RocmBuildPlan:
    """One ROCm cell's build: backend, environment for setup.py, and what the wheel will (not) contain."""

    cell_id: str
    backend: Backend
    env: dict[str, str]
    compiled_arches: tuple[str, ...]
    target_arches: tuple[str, ...]
    max_jobs: int
    parallelism_reason: str
    torch_index: str
    torch_requirement: str
    wheel_tag: str
    import_names: tuple[str, ...]
    import_env: dict[str, str] = field(default_factory=dict)

    @property
    def needs_hipcc(self) -> bool:
        return self.backend == "ck"

    @property
    def needs_rocm_torch(self) -> bool:
        """CK compiles against a HIP torch; the Triton build only imports torch (any build does)."""
        return self.backend == "ck"

    @property
    def pure_python(self) -> bool:
        return self.backend == "triton"

    def manifest_fields(self) -> dict[str, object]:
        """Fields the wheel's manifest carries: a Triton wheel never claims compiled (CK) kernels."""
        return {
            "rocm_backend": self.backend,
            "ck_kernels": self.backend == "ck",
            "compiled_arches": list(self.compiled_arches),
            "target_arches": list(self.target_arches),
            "pure_python": self.pure_python,
        }

    def to_json(self) -> dict[str, object]:
        return {
            "cell_id": self.cell_id,
            **self.manifest_fields(),
            "env": dict(self.env),
            "max_jobs": self.max_jobs,
            "parallelism": self.parallelism_reason,
            "torch_index": self.torch_index,
            "torch_index_url": TORCH_INDEX_URL.format(name=self.torch_index),
            "torch_requirement": self.torch_requirement,
            "wheel_tag": self.wheel_tag,
            "needs_hipcc": self.needs_hipcc,
            "needs_rocm_torch": self.needs_rocm_torch,
            "import_names": list(self.import_names),
            "import_env": dict(self.import_env),
        }


def plan_rocm_build(
    cell: Cell,
    *,
    data: CompatData | None = None,
    settings: BuildSettings | None = None,
    machine: Machine | None = None,
) -> RocmBuildPlan:
    """The build plan of a ROCm cell; ConfigurationError when the cell cannot be built as asked."""
    backend = backend_of(cell)
    bad = unsupported_profile_knobs(cell)
    if bad:
        raise ConfigurationError(f"{cell.id}: profile '{cell.profile}' sets {'; '.join(bad)}: not for ROCm")
    index = torch_index_name(cell, data)
    requirement = f"torch=={cell.torch}"  # the rocmX.Y index serves it as X.Y.Z+rocmX.Y
    if backend == "triton":
        par = settings or rocm_parallelism(cell)
        env = triton_env(local_version=cell.local_version, cxx11_abi=cell.cxx11_abi)
        return RocmBuildPlan(
            cell.id,
            backend,
            env,
            (),
            cell.arches,
            1,
            par.reason,
            index,
            requirement,
            cell.wheel_tag,
            ("flash_attn",),
            dict(TRITON_IMPORT_ENV),
        )
    archs = gpu_archs_value(cell.arches, ck_allowed_gfx(cell, data))
    par = settings or rocm_parallelism(cell, machine=machine)
    env = ck_env(
        gpu_archs=archs, max_jobs=par.max_jobs, local_version=cell.local_version, cxx11_abi=cell.cxx11_abi
    )
    return RocmBuildPlan(
        cell.id,
        backend,
        env,
        cell.arches,
        cell.arches,
        par.max_jobs,
        par.reason,
        index,
        requirement,
        cell.wheel_tag,
        ("flash_attn_2_cuda", "flash_attn"),
    )


def build_env(
    cell: Cell, settings: BuildSettings | None = None, data: CompatData | None = None
) -> dict[str, str]:
    """Just the environment (what a builder sets on top of its own, after removing `builder.knobs.ROCM_ENV_TO_CLEAR`)."""
    return dict(plan_rocm_build(cell, data=data, settings=settings).env)
