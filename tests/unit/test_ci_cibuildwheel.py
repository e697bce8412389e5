"""The per-cell cibuildwheel configuration attnforge exports for other projects' CI (`attnforge ci
cibuildwheel`), checked by cibuildwheel itself: values, TOML, cibuildwheel's own schema and
`--print-build-identifiers` on the generated file when cibuildwheel is installed. No Docker, no compile.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.ci.cibuildwheel_config import caveats, cibuildwheel_config, repair_command, to_toml
from attnforge.core.errors import ConfigurationError
from attnforge.matrix.cell import Cell
from attnforge.matrix.project import Project

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
Run = Callable[..., tuple[int, str, str]]
MINI = str(ROOT / "tests" / "data" / "compat_mini.toml")


@pytest.fixture(scope="module")
def project() -> Project:
    return Project(ROOT / "matrix.yaml", MINI)


@pytest.fixture(scope="module")
def cell(project: Project) -> Cell:
    return project.plan("default").valid[0]


@pytest.fixture(scope="module")
def rocm_cell(project: Project) -> Cell:
    return next(c for c in project.plan("release").valid if c.toolkit.kind == "rocm")


def cibuildwheel_exe() -> str | None:
    return shutil.which("cibuildwheel") or shutil.which("cibuildwheel", path=str(Path(sys.executable).parent))


# ---- the config on its own (a project's CI: stock manylinux image, toolkit via dnf) ----


def test_cuda_cell_config(cell: Cell) -> None:
    cfg = cibuildwheel_config(cell, max_jobs=6, nvcc_threads=2)
    assert cfg["build"] == "cp311-manylinux_x86_64"
    assert cfg["manylinux-x86_64-image"] == "manylinux_2_28"
    assert cfg["build-frontend"] == "pip; args: --no-build-isolation --use-pep517"  # attnforge's pip line
    assert "cuda-nvcc-13-0" in cfg["before-all"]  # dnf install into the stock manylinux image
    assert "torch==2.14.1" in cfg["before-build"] and "whl/cu130" in cfg["before-build"]
    assert "'setuptools>=77'" in cfg["before-build"] and "psutil" not in cfg["before-build"]
    env = cfg["environment"]
    assert env["MAX_JOBS"] == "6" and env["NVCC_THREADS"] == "2"
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "90" and env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert env["FLASH_ATTN_LOCAL_VERSION"] == cell.local_version
    assert "-DFLASHATTENTION_DISABLE_BACKWARD" in env["NVCC_APPEND_FLAGS"]
    repair = cfg["repair-wheel-command"]
    for lib in ("'libtorch*.so*'", "'libc10*.so*'", "'libcudart.so*'", "'libnvrtc*.so*'"):
        assert f"--exclude {lib}" in repair
    assert "libamdhip64" not in repair
    assert repair.endswith("--plat manylinux_2_28_x86_64 -w {dest_dir} {wheel}")
    assert "import torch, flash_attn, flash_attn_2_cuda" in cfg["test-command"]
    assert cfg["test-environment"]["PIP_INDEX_URL"].endswith("/whl/cu130")
    assert "MAX_JOBS" not in cibuildwheel_config(cell)["environment"]  # nothing guessed


def test_image_and_pypi_toolkit_sources(cell: Cell) -> None:
    cfg = cibuildwheel_config(cell, image="local/manylinux-cuda:13.0", create_args=("--gpus", "all"))
    assert cfg["manylinux-x86_64-image"] == "local/manylinux-cuda:13.0"
    assert cfg["before-all"].startswith("nvcc --version")
    assert cfg["container-engine"] == {"name": "docker", "create-args": ["--gpus", "all"]}
    assert "--plat auto -w" in cfg["repair-wheel-command"]  # the best tag, as `wheels finalize` picks it
    pypi = cibuildwheel_config(cell, toolkit_source="pypi")["before-all"]
    assert "'nvidia-cuda-nvcc==13.0.*'" in pypi and "/opt/cuda-pypi/nvidia/cu13" in pypi


def test_refusals(project: Project, cell: Cell, rocm_cell: Cell) -> None:
    old = project.plan("nightly").valid
    cu128 = next(c for c in old if c.toolkit.version == "12.8")
    with pytest.raises(ConfigurationError, match="no nvcc"):
        cibuildwheel_config(cu128, toolkit_source="pypi")
    with pytest.raises(ConfigurationError, match="toolkit_source"):
        cibuildwheel_config(cell, toolkit_source="conda")
    with pytest.raises(ConfigurationError, match="ROCm"):
        cibuildwheel_config(rocm_cell)
    with pytest.raises(ConfigurationError, match="quotes"):
        cibuildwheel_config(cell, env={"X": 'say "hi"'})  # cibuildwheel would evaluate it as bash
    cfg = cibuildwheel_config(rocm_cell, image="local/manylinux-rocm:6.4")
    assert cfg["environment"]["BUILD_TARGET"] == "rocm" and cfg["environment"]["GPU_ARCHS"] == "gfx90a;gfx942"
    assert "--exclude 'libamdhip64.so*'" in cfg["repair-wheel-command"]
    assert "libcudart" not in cfg["repair-wheel-command"]


def test_toml_round_trips_with_caveats(cell: Cell) -> None:
    cfg = cibuildwheel_config(cell, max_jobs=2)
    text = to_toml(cfg, cell)
    assert tomllib.loads(text) == {"tool": {"cibuildwheel": cfg}}
    assert text.startswith(f"# cibuildwheel config for {cell.id}")
    assert any("patches" in c for c in caveats(cell))  # torch 2.14 needs the cxx20 patch
    assert any("dispatch-subset" in c for c in caveats(cell))  # fwd128: head dim/dtype subset


def test_repair_command_quotes_patterns() -> None:
    assert (
        repair_command(["libtorch*.so*"], None)
        == "auditwheel repair --exclude 'libtorch*.so*' -w {dest_dir} {wheel}"
    )


# ---- cibuildwheel's own schema and parser ----


def test_cibuildwheel_schema_accepts_it(cell: Cell) -> None:
    schema_mod = pytest.importorskip("jsonschema", reason="jsonschema not installed")
    cibw = pytest.importorskip("cibuildwheel", reason="cibuildwheel not installed (pip install cibuildwheel)")
    from importlib import resources

    schema = json.loads(resources.files(cibw).joinpath("resources/cibuildwheel.schema.json").read_text())
    schema_mod.validate(cibuildwheel_config(cell, max_jobs=2, create_args=("--gpus", "all")), schema)
    schema_mod.validate(
        cibuildwheel_config(cell, image="x", pip_env={"PIP_FIND_LINKS": "/w"}, disable_host_mount=True),
        schema,
    )


def test_cibuildwheel_reads_it(cell: Cell, tmp_path: Path) -> None:
    exe = cibuildwheel_exe()
    if exe is None:
        pytest.skip("cibuildwheel not installed (pip install 'attnforge[cibuildwheel]')")
    config = tmp_path / "cibw.toml"
    config.write_text(to_toml(cibuildwheel_config(cell), cell))
    src = tmp_path / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text('[project]\nname = "flash_attn"\nversion = "2.8.3"\n')
    proc = subprocess.run(
        [exe, "--platform", "linux", "--config-file", str(config), "--print-build-identifiers", str(src)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=src,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cp311-manylinux_x86_64"]


def test_export_command_writes_the_cells_config(run_cli: Run, tmp_path: Path, cell: Cell) -> None:
    out = tmp_path / "cibw.toml"
    head = ("--matrix", str(ROOT / "matrix.yaml"), "--compat", MINI, "ci", "cibuildwheel")
    code, stdout, stderr = run_cli(*head, "--cell", cell.id, "-o", str(out))
    assert code == 0, stderr
    assert tomllib.loads(out.read_text())["tool"]["cibuildwheel"] == cibuildwheel_config(cell)
    assert "caveat: needs attnforge's source patches (cxx20)" in stdout
    code, stdout, stderr = run_cli(*head, "--cell", "no-such-cell")
    assert code == 2 and "no cell 'no-such-cell'" in stderr
