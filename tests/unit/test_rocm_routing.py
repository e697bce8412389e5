"""ROCm cells in `attnforge build`: names (py3-none-any for Triton), per-cell backends, the CK refusal, --cell lookup."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.builder.spec import Source
from attnforge.cli.commands.build import cells_to_build
from attnforge.core.errors import BuildError, ConfigurationError, EnvironmentProblem
from attnforge.engine.backends.docker import DockerBackend
from attnforge.engine.backends.local import LocalBackend
from attnforge.engine.backends.routing import RocmCkBackend, route_of
from attnforge.engine.jobs import TRITON_BUILD_TORCH_ENV, input_hash
from attnforge.engine.progress import PlainProgressView
from attnforge.engine.rocm.build_plan import plan_rocm_build
from attnforge.engine.rocm.toolchain import ck_needs
from attnforge.engine.run import Engine
from attnforge.matrix.cell import Cell
from attnforge.matrix.project import Project

ROOT = Path(__file__).resolve().parents[2]
Run = Callable[..., tuple[int, str, str]]
TRITON_ID = "flash-attn-2.8.3-rocm6.4-torch2.9.1-cp312-abi1-gfx90a-gfx942-triton-x86_64"
CK_ID = "flash-attn-2.8.3-rocm6.4-torch2.8.0-cp312-abi1-gfx90a-gfx942-ck-x86_64"


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """The repository's matrix.yaml in a scratch folder (output and cache land there, never in the repo)."""
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    return Project(tmp_path / "matrix.yaml")


@pytest.fixture
def cells(project: Project) -> dict[str, Cell]:
    plan = project.plan("release")
    by_id = {c.id: c for c in plan.valid}
    default = project.plan("default").valid[0]
    return {"triton": by_id[TRITON_ID], "ck": by_id[CK_ID], "cuda": default}


@pytest.fixture
def no_rocm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This machine as it is (no hipcc), with ROCM_PATH pointing at an empty folder to be sure."""
    if shutil.which("hipcc"):
        pytest.skip("hipcc is installed here")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))


def test_triton_cell_names_a_pure_wheel(cells: dict[str, Cell]) -> None:
    triton, ck, cuda = cells["triton"], cells["ck"], cells["cuda"]
    assert triton.pure_python and not ck.pure_python and not cuda.pure_python
    assert triton.wheel_name == "flash_attn-2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton-py3-none-any.whl"
    assert ck.wheel_name == "flash_attn-2.8.3+rocm6.4torch2.8cxx11abiTRUE.ck-cp312-cp312-linux_x86_64.whl"
    assert cuda.wheel_name.endswith("-cp311-cp311-linux_x86_64.whl")
    assert plan_rocm_build(triton).wheel_tag == triton.wheel_tag == "py3-none-any"
    assert plan_rocm_build(ck).wheel_tag == ck.wheel_tag == "cp312-cp312-linux_x86_64"
    assert triton.to_json()["wheel"] == triton.wheel_name


def test_each_cell_gets_its_backend(project: Project, cells: dict[str, Cell]) -> None:
    assert [route_of(cells[k]) for k in ("cuda", "triton", "ck")] == ["default", "triton", "rocm-ck"]
    local = LocalBackend()
    engine = Engine(project, local, PlainProgressView())
    assert engine.backend_for(cells["cuda"]) is local
    triton = engine.backend_for(cells["triton"])
    assert (
        isinstance(triton, LocalBackend)
        and triton is not local
        and triton is engine.backend_for(cells["triton"])
    )
    assert isinstance(engine.backend_for(cells["ck"]), RocmCkBackend)
    docker = Engine(project, DockerBackend(project), PlainProgressView())
    assert isinstance(docker.backend_for(cells["triton"]), LocalBackend)  # whatever --backend says
    par = engine.settings(cells["triton"], 1)
    assert par.max_jobs == 1 and "no device code" in par.reason


def test_triton_spec_builds_with_a_cpu_stand_in_torch(
    project: Project, cells: dict[str, Cell], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same builder, told to build with this machine's Python and the pinned CPU torch (the wheel is
    py3-none-any; setup.py only imports torch); ATTNFORGE_TRITON_BUILD_TORCH names another."""
    monkeypatch.delenv(TRITON_BUILD_TORCH_ENV, raising=False)
    engine = Engine(project, LocalBackend(), PlainProgressView())
    source = Source("/s/flash_attn-2.8.3.tar.gz", "0" * 64)
    spec = engine.job_for(cells["triton"], source, 1, "h").spec
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert spec.pure_python and spec.python == py and spec.torch_variant is None
    assert spec.torch_requirement == "torch==2.13.0+cpu" and spec.torch == "2.13.0"
    assert spec.venv_dir.endswith(f"venvs/triton-build-cp{py.replace('.', '')}") and not spec.import_check
    monkeypatch.setenv(TRITON_BUILD_TORCH_ENV, "torch==2.9.1+cpu")
    other = engine.job_for(cells["triton"], source, 1, "h").spec
    assert other.torch_requirement == "torch==2.9.1+cpu" and other.torch == "2.9.1"


def test_input_hash_depends_on_the_backend(project: Project, cells: dict[str, Cell]) -> None:
    assert input_hash(cells["triton"], LocalBackend().identity()) != input_hash(
        cells["triton"], DockerBackend(project).identity()
    )


@pytest.mark.usefixtures("no_rocm")
def test_ck_cell_is_refused_with_what_is_missing(project: Project, cells: dict[str, Cell]) -> None:
    needs = ck_needs(cells["ck"], project.compat)
    assert needs.hipcc is None and needs.rocm_version is None
    assert needs.torch_index_url == "https://download.pytorch.org/whl/rocm6.4"
    with pytest.raises(EnvironmentProblem) as exc:
        RocmCkBackend(project).prepare([cells["ck"]], PlainProgressView())
    text = str(exc.value)
    assert exc.value.exit_code == 5
    assert CK_ID in text and "missing hipcc" in text and "ROCm 6.4" in text
    assert (
        "torch==2.8.0 from https://download.pytorch.org/whl/rocm6.4" in text and "never compiled CK" in text
    )


def test_ck_with_a_toolchain_is_still_refused(
    project: Project, cells: dict[str, Cell], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A (stand-in) ROCm 6.4 install: nothing is missing, but attnforge has no CK builder: exit 4."""
    rocm = tmp_path / "rocm"
    (rocm / "bin").mkdir(parents=True)
    (rocm / ".info").mkdir()
    (rocm / ".info" / "version").write_text("6.4.1-120\n")
    (rocm / "bin" / "hipcc").write_text("#!/bin/sh\nexit 1\n")
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert ck_needs(cells["ck"]).missing() == []
    (rocm / ".info" / "version").write_text("6.40.0\n")  # not 6.4
    assert ck_needs(cells["ck"]).missing() == ["ROCm 6.4 (this machine has 6.40.0)"]
    (rocm / ".info" / "version").write_text("6.4.1-120\n")
    with pytest.raises(BuildError, match="cannot compile ROCm CK cells yet") as exc:
        RocmCkBackend(project).prepare([cells["ck"]], PlainProgressView())
    assert exc.value.exit_code == 4


@pytest.mark.usefixtures("no_rocm")
def test_build_ck_cell_exits_5_without_traceback(run_cli: Run, project: Project) -> None:
    code, out, err = run_cli("--matrix", str(project.matrix_path), "build", "--cell", CK_ID, "--quiet")
    assert code == 5
    assert "missing hipcc" in err and "Traceback" not in out + err
    assert not list(project.path("wheels").glob("*.whl"))


def test_cell_is_found_in_any_target_without_target(project: Project) -> None:
    assert [c.id for c in cells_to_build(project, None, [TRITON_ID])] == [TRITON_ID]
    assert [c.id for c in cells_to_build(project, "release", [TRITON_ID])] == [TRITON_ID]
    assert cells_to_build(project, None, []) == project.plan("default").valid
    with pytest.raises(ConfigurationError, match="no cell .* in target 'default'"):
        cells_to_build(project, "default", [TRITON_ID])
    with pytest.raises(ConfigurationError, match="in any target"):
        cells_to_build(project, None, ["flash-attn-nope"])


def test_dry_run_names_the_backend_and_the_wheel(run_cli: Run, project: Project) -> None:
    code, out, err = run_cli("--matrix", str(project.matrix_path), "build", "--cell", TRITON_ID, "--dry-run")
    assert code == 0, err
    assert "triton-py3-none-any.whl (local)" in out + err and "max_jobs=1 (triton backend" in out + err
