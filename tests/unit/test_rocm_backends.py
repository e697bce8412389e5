"""ROCm build environments: CK (hipcc, named gfx arches, MAX_JOBS from the scheduler) and Triton (nothing compiled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.builder.knobs import ROCM_ENV_TO_CLEAR as ENV_TO_CLEAR
from attnforge.core.errors import ConfigurationError
from attnforge.engine.resources import JobMemoryTable, Machine
from attnforge.engine.rocm.build_plan import (
    CK_GFX_DEFAULT,
    backend_of,
    build_env,
    gpu_archs_value,
    plan_rocm_build,
    rocm_parallelism,
    torch_index_name,
)
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import CompatData, load_compat
from attnforge.matrix.file import parse_matrix
from attnforge.matrix.plan import plan_target
from attnforge.matrix.schema import ProfileSpec

ROOT = Path(__file__).resolve().parents[2]
TRITON = ProfileSpec(tag="triton", rocm_backend="triton")
CK = ProfileSpec(rocm_backend="ck")
BIG = Machine(cores=16, memory_available_gb=120.0, memory_limit_source="test")
SMALL = Machine(cores=2, memory_available_gb=10.0, memory_limit_source="test")


def rocm_cell(
    profile: str, spec: ProfileSpec, arches: tuple[str, ...] = ("gfx90a", "gfx942"), **kw: object
) -> Cell:
    args: dict[str, object] = {
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "toolkit": Toolkit.parse("rocm6.4"),
        "torch": "2.9.1",
        "python": "3.12",
        "cxx11_abi": True,
        "arches": arches,
        "profile": profile,
        "torch_variant": "rocm6.4",
        "profile_spec": spec,
    }
    args.update(kw)
    return Cell(**args)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def release_cells() -> dict[str, Cell]:
    """The ROCm cells `attnforge plan -t release` validates, by profile."""
    plan = plan_target(parse_matrix((ROOT / "matrix.yaml").read_text()), "release", load_compat())
    cells = [c for c in plan.valid if c.toolkit.kind == "rocm"]
    assert cells, "the release target has no valid ROCm cell"
    return {f"{c.profile}-{c.toolkit}": c for c in cells}


def test_ck_env_of_the_release_cell(release_cells: dict[str, Cell]) -> None:
    cell = release_cells["ck-rocm6.4"]
    plan = plan_rocm_build(cell, machine=SMALL, data=load_compat())
    env = plan.env
    assert env["BUILD_TARGET"] == "rocm"
    assert env["GPU_ARCHS"] == "gfx90a;gfx942" == env["PYTORCH_ROCM_ARCH"]
    assert env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "FALSE"  # a leftover TRUE would give a pure wheel
    assert env["FLASH_ATTN_LOCAL_VERSION"] == "rocm6.4torch2.8cxx11abiTRUE.ck"
    assert env["FLASH_ATTENTION_FORCE_CXX11_ABI"] == "TRUE"
    assert int(env["MAX_JOBS"]) == plan.max_jobs >= 1
    assert "native" not in env["GPU_ARCHS"]
    assert plan.manifest_fields() == {
        "rocm_backend": "ck",
        "ck_kernels": True,
        "compiled_arches": ["gfx90a", "gfx942"],
        "target_arches": ["gfx90a", "gfx942"],
        "pure_python": False,
    }
    assert plan.needs_hipcc and plan.needs_rocm_torch and not plan.pure_python
    assert plan.wheel_tag == "cp312-cp312-linux_x86_64"
    assert plan.import_names == ("flash_attn_2_cuda", "flash_attn")
    assert plan.torch_index == "rocm6.4" and plan.torch_requirement == "torch==2.8.0"


def test_triton_env_of_the_release_cell(release_cells: dict[str, Cell]) -> None:
    cell = release_cells["triton-rocm6.4"]
    plan = plan_rocm_build(cell)
    assert plan.env == {
        "BUILD_TARGET": "rocm",
        "FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE",
        "FLASH_ATTENTION_SKIP_CK_BUILD": "TRUE",
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
        "FLASH_ATTENTION_SKIP_CUDA_BUILD": "FALSE",
        "FLASH_ATTENTION_FORCE_CXX11_ABI": "TRUE",
        "FLASH_ATTN_LOCAL_VERSION": "rocm6.4torch2.9cxx11abiTRUE.triton",
        "MAX_JOBS": "1",
    }
    assert "GPU_ARCHS" not in plan.env  # nothing is compiled: no arch list to name
    assert plan.manifest_fields()["compiled_arches"] == []
    assert plan.manifest_fields()["rocm_backend"] == "triton"
    assert plan.manifest_fields()["ck_kernels"] is False
    assert plan.pure_python and not plan.needs_hipcc and not plan.needs_rocm_torch
    assert plan.wheel_tag == "py3-none-any"
    assert plan.import_env == {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"}
    assert cell.local_version.endswith(".triton")


def test_rocm7_ck_cell_names_its_own_arches(release_cells: dict[str, Cell]) -> None:
    plan = plan_rocm_build(release_cells["ck-rocm7.0"], machine=BIG, data=load_compat())
    assert plan.env["GPU_ARCHS"] == "gfx942;gfx950"
    assert plan.torch_index == "rocm7.0"


def test_max_jobs_comes_from_the_scheduler() -> None:
    cell = rocm_cell("ck", CK)
    table = JobMemoryTable()
    per_arch, _ = table.per_arch_gb("rocm6.4", "full")
    small = rocm_parallelism(cell, machine=SMALL, table=table)
    big = rocm_parallelism(cell, machine=BIG, table=table)
    assert small.max_jobs == min(2, int((SMALL.memory_available_gb - 2.0) // per_arch))
    assert big.max_jobs == 16  # cores bind before memory; hipcc has no --threads: one arch's memory per job
    assert big.nvcc_threads == 1
    assert "MAX_JOBS=16" in big.reason
    assert rocm_parallelism(cell, machine=BIG, max_jobs=3).max_jobs == 3
    assert build_env(cell, rocm_parallelism(cell, machine=SMALL, table=table))["MAX_JOBS"] == str(
        small.max_jobs
    )


def test_triton_compiles_nothing_so_one_job() -> None:
    par = rocm_parallelism(rocm_cell("triton", TRITON), machine=BIG)
    assert par.max_jobs == 1 and "no device code" in par.reason


@pytest.mark.parametrize(
    ("arches", "needle"),
    [
        ((), "needs its gfx arches named"),
        (("native",), "builders have none"),
        (("gfx1100",), "cannot compile for gfx1100"),
    ],
)
def test_gpu_archs_refuses_native_empty_and_unsupported(arches: tuple[str, ...], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        gpu_archs_value(arches, CK_GFX_DEFAULT)
    with pytest.raises(ConfigurationError, match=needle):
        plan_rocm_build(rocm_cell("ck", CK, arches=arches), machine=SMALL)


def test_ck_allowed_list_comes_from_compat(mini_compat: CompatData) -> None:
    cell = rocm_cell("ck", CK, arches=("gfx950",))
    assert plan_rocm_build(cell, data=mini_compat, machine=SMALL).env["GPU_ARCHS"] == "gfx950"


def test_profile_knobs_rocm_cannot_honour() -> None:
    spec = ProfileSpec(tag="x", rocm_backend="ck", head_dims=[128], disable=["backward"])
    with pytest.raises(ConfigurationError, match="disable .*head_dims"):
        plan_rocm_build(rocm_cell("x", spec), machine=SMALL)


def test_cuda_cell_is_not_rocm() -> None:
    cuda = rocm_cell("full", ProfileSpec(), toolkit=Toolkit.parse("cuda13.0"), arches=("sm_90",))
    with pytest.raises(ConfigurationError, match="not a ROCm toolkit"):
        backend_of(cuda)


def test_default_backend_is_ck() -> None:
    assert backend_of(rocm_cell("full", ProfileSpec())) == "ck"


def test_torch_index_exact_names() -> None:
    data = load_compat()
    assert (
        torch_index_name(rocm_cell("ck", CK, torch="2.5.1", toolkit=Toolkit.parse("rocm6.2")), data)
        == "rocm6.2"
    )
    assert (
        torch_index_name(rocm_cell("ck", CK, torch="2.6.0", toolkit=Toolkit.parse("rocm6.2")), data)
        == "rocm6.2.4"
    )
    assert torch_index_name(rocm_cell("ck", CK), None) == "rocm6.4"


def test_env_to_clear_covers_every_cross_backend_knob() -> None:
    triton = plan_rocm_build(rocm_cell("triton", TRITON)).env
    ck = plan_rocm_build(rocm_cell("ck", CK), machine=SMALL).env
    # every knob one backend sets and the other does not is cleared first, so leftovers cannot leak
    for key in set(triton) ^ set(ck):
        assert key in ENV_TO_CLEAR, key
