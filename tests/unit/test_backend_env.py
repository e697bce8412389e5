"""`attnforge build --python`: the cell read from an environment, named like a planned one (a release torch)
or by its exact build (a custom torch); the rules it still answers to; the command line's errors."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.builder.spec import Source
from attnforge.core.errors import ConfigurationError
from attnforge.engine.backends.env import EnvBackend, environment_cell, template_cell
from attnforge.engine.environment import Env
from attnforge.engine.progress import PlainProgressView
from attnforge.engine.run import Engine
from attnforge.matrix.project import Project
from attnforge.wheels.manifest import manifest_inputs
from attnforge.wheels.naming import cell_from_manifest, expected_names, parse_local

ROOT = Path(__file__).resolve().parents[2]
Run = Callable[..., tuple[int, str, str]]
H100 = Env(
    python="3.12",
    machine="x86_64",
    glibc=(2, 39),
    torch="2.11.0+cu130",
    accel="cu130",
    cxx11_abi=True,
    gpus=("sm_90",),
    driver_cuda="13.0",
)
NGC = Env(
    python="3.12",
    machine="x86_64",
    glibc=(2, 39),
    torch="2.10.0a0+5a8cd0ef.nv25.06",
    accel="cu129",
    cxx11_abi=True,
    gpus=("sm_90",),
    driver_cuda="13.0",
)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    return Project(tmp_path / "matrix.yaml")


def test_a_release_torch_gives_the_planned_cells_names(project: Project) -> None:
    cell = environment_cell(project, H100, template_cell(project, H100, "hd64128", [], None))
    (planned,) = [c for c in project.plan("gpu-runner").valid if c.profile == "hd64128"]
    assert cell.id == planned.id == "flash-attn-2.8.3-cu130-torch2.11.0-cp312-abi1-sm90-hd64128-x86_64"
    assert cell.wheel_name == planned.wheel_name and cell.kernel_set_key == planned.kernel_set_key
    assert cell.local_version == "cu130torch2.11cxx11abiTRUE.hd64128" and cell.custom_torch is None
    assert cell.torch_build == "2.11.0+cu130" and cell.torch_variant == "cu130"
    assert expected_names({"kernel_version": "2.8.3", "inputs": manifest_inputs(cell)}).torch_requirement == (
        "torch==2.11.*"
    )


def test_a_custom_torch_build_is_named_by_its_build(project: Project) -> None:
    cell = environment_cell(project, NGC, template_cell(project, NGC, "fwd128", ["sm_90"], None))
    assert cell.local_version == "cu129torch2.10cxx11abiTRUE.pt2100a05a8cd0efnv2506.fwd128"
    assert cell.variant == "cu129-torch2.10-pt2100a05a8cd0efnv2506"
    parts = parse_local(cell.local_version)
    assert parts is not None and parts.variant == cell.variant and parts.profile_tag == "fwd128"
    names = expected_names({"kernel_version": "2.8.3", "inputs": manifest_inputs(cell)})
    assert names.torch_requirement == "torch==2.10.0a0+5a8cd0ef.nv25.06"  # that build, nothing else
    again = cell_from_manifest({"kernel_version": "2.8.3", "inputs": manifest_inputs(cell)})
    assert again.wheel_name == cell.wheel_name
    other = environment_cell(project, H100, template_cell(project, H100, "fwd128", ["sm_90"], None))
    assert other.kernel_set_key != cell.kernel_set_key


def test_the_rules_still_check_what_the_environment_leaves_open(project: Project) -> None:
    cell = template_cell(project, H100, "hd64128", ["sm_75"], None)
    with pytest.raises(ConfigurationError, match=r"\[kernel-requirements\].*sm_75 is too old"):
        environment_cell(project, H100, cell)
    no_gpu = Env(**{**H100.__dict__, "gpus": ()})
    with pytest.raises(ConfigurationError, match="no --arch given and no GPU"):
        template_cell(project, no_gpu, None, [], None)


def test_the_env_spec_builds_with_the_interpreter_in_its_own_tree(project: Project) -> None:
    cell = environment_cell(project, H100, template_cell(project, H100, "hd64128", [], None))
    engine = Engine(project, EnvBackend("/opt/torch/bin/python3", H100), PlainProgressView())
    job = engine.job_for(cell, Source("/s/fa.tar.gz", "0" * 64), 1, "h")
    assert job.spec.use_interpreter and job.spec.python == "/opt/torch/bin/python3"
    assert job.spec.torch == "2.11.0+cu130" and job.workdir.name == "cp312-torch2.11.0-env"
    assert job.spec.kernel_objects_dir == str(job.workdir.parent / "objects")  # shared with other backends


def test_command_line_errors(run_cli: Run, project: Project) -> None:
    matrix = str(project.matrix_path)
    code, _, err = run_cli("--matrix", matrix, "build", "--profile", "hd64128")
    assert code == 2 and "--profile and --arch go with --python" in err
    code, _, err = run_cli("--matrix", matrix, "build", "--python", "/no/such/python")
    assert code == 2 and "--python /no/such/python: no such interpreter" in err
    code, _, err = run_cli("--matrix", matrix, "build", "--python", sys.executable, "--backend", "docker")
    assert code == 2 and "env backend, not --backend docker" in err


def test_an_interpreter_without_a_gpu_torch_is_an_environment_problem(run_cli: Run, project: Project) -> None:
    """This interpreter has no torch (the host) or a CPU one (the test session's venv): both refused."""
    code, _, err = run_cli("--matrix", str(project.matrix_path), "build", "--python", sys.executable)
    assert code == 5 and ("has no importable torch" in err or "is a CPU build" in err)
