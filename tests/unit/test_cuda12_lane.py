"""CUDA 12 lanes without compiling: the torch-variant ABI rule, the host-compiler rule (plan time and the
docker backend), the builder's g++ choice, the base a CUDA 12 toolkit gets, and the workflows' devel bases.

The packaged compat tables are used (the facts the rules are about). Compilers in the builder tests are
shell-script test doubles that only answer `--version` / `-dumpfullversion`; the real choice is made in
tests/integration/test_build_cu124.py's trixie check.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from attnforge.builder import compiler
from attnforge.builder.exits import EXIT_ENV, BuildFailure
from attnforge.builder.report import Reporter
from attnforge.ci.workflow_spec import KernelSetJob
from attnforge.ci.workflows import devel_base
from attnforge.cli.commands.build import parse_base_images
from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.core.package_files import packaged_docker_dir
from attnforge.engine.backends.cuda_standin import STANDINS, build_command
from attnforge.engine.backends.docker import LOCAL_BASE, DockerBackend, python_prefix
from attnforge.engine.progress import PlainProgressView
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import load_compat
from attnforge.matrix.project import Project
from attnforge.matrix.rules import check, host_compiler_problem

ROOT = Path(__file__).resolve().parents[2]
STANDIN = STANDINS["12.4"].tag


def cell(**kw: object) -> Cell:
    base: dict[str, object] = dict(
        kernel="flash-attn",
        kernel_version="2.8.3",
        toolkit=Toolkit.parse("cuda12.4"),
        torch="2.6.0",
        python="3.11",
        cxx11_abi=False,
        arches=("sm_80", "sm_90"),
        profile="fwd128",
    )
    base.update(kw)
    return Cell(**base)


def project_with(tmp_path: Path, **build: object) -> Project:
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"] |= {"output_dir": str(tmp_path / "wheels"), **build}
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return Project(tmp_path / "matrix.yaml")


# ---- rules


def test_torch_2_6_cu124_is_pre_cxx11_only() -> None:
    data = load_compat()
    assert check(cell(), data).valid
    v = check(cell(cxx11_abi=True), data)
    assert [p.rule for p in v.problems] == ["torch-abi"]
    assert "torch 2.6's cu124 wheels use cxx11abi=FALSE only, not TRUE" in v.reasons()[0]
    # torch 2.6 on CUDA 12.6 compiles against the cu126 build: cxx11 ABI only
    assert [p.rule for p in check(cell(toolkit=Toolkit.parse("cuda12.6")), data).problems] == ["torch-abi"]


@pytest.mark.parametrize(
    ("image", "os_name"),
    [
        ("nvidia/cuda:12.4.1-devel-ubuntu22.04", "ubuntu22.04"),
        ("nvidia/cuda:13.4.1-devel-ubuntu24.04@sha256:" + "0" * 64, "ubuntu24.04"),
        (LOCAL_BASE, "debian12"),
        ("local/debian:trixie", "debian13"),
        (STANDIN, "debian12"),
        ("registry.example:5000/cuda", None),
    ],
)
def test_os_of_an_image_from_its_tag(image: str, os_name: str | None) -> None:
    found = load_compat().os_of_image(image)
    assert (found.name if found else None) == os_name


def test_host_compiler_rule() -> None:
    data = load_compat()
    cuda118, cuda124 = Toolkit.parse("cuda11.8"), Toolkit.parse("cuda12.4")
    problem = host_compiler_problem(cuda118, "local/debian:trixie", data)
    assert problem is not None and problem.rule == "host-compiler"
    assert problem.message.startswith("CUDA 11.8 accepts gcc <= 11 (crt/host_config.h), but its builder base")
    assert "offers g++ 12, 13, 14 only: pick another base with build.base_images.cuda11.8" in problem.message
    assert host_compiler_problem(cuda124, "local/debian:trixie", data) is None  # g++-13 is offered
    assert host_compiler_problem(cuda118, "registry.example:5000/cuda", data) is None  # OS unknown


def test_plan_refuses_a_declared_base_without_a_supported_gxx(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["targets"] = {
        "t": {
            "matrix": {
                "toolkit": ["cuda12.4"],
                "torch": ["2.6.0"],
                "python": ["3.11"],
                "cxx11_abi": [False],
                "arch": [["sm_80"]],
                "profile": ["fwd128"],
            }
        }
    }
    data["build"]["base_images"] = {"cuda12.4": "local/debian:trixie"}
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    ok = Project(tmp_path / "matrix.yaml").plan("t").verdicts[0]
    assert ok.valid and any("gets g++-13 and builds with it" in n for n in ok.notes), ok.notes
    # a compat table whose CUDA 12.4 accepts gcc <= 11 only: trixie offers no such g++ -> refused at plan time
    compat = (ROOT / "src/attnforge/data/compat.toml").read_text()
    low = compat.replace(
        'max_gcc = 13\ndevel_image = "nvidia/cuda:12.4.1',
        'max_gcc = 11\ndevel_image = "nvidia/cuda:12.4.1',
        1,
    )
    assert low != compat
    (tmp_path / "compat.toml").write_text(low)
    bad = Project(tmp_path / "matrix.yaml", str(tmp_path / "compat.toml")).plan("t").verdicts[0]
    assert [p.rule for p in bad.problems] == ["host-compiler"]


# ---- the builder's g++ choice (builder/compiler.gcc_for_toolkit)


def fake_compilers(folder: Path, versions: dict[str, str]) -> dict[str, str]:
    """Test doubles: `name` scripts printing a gcc banner / version; returns an env with them first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in versions.items():
        script = folder / name
        script.write_text(
            "#!/bin/sh\n"
            f'case "$1" in --version) echo "{name} (Debian {version}) {version}";; '
            f"-dumpfullversion) echo {shlex.quote(version)};; esac\n"
        )
        script.chmod(0o755)
    return {"PATH": str(folder), "CXX": str(folder / "c++")}  # only the doubles: no host g++-N


class Lines(Reporter):
    """A reporter that keeps its lines."""

    def __init__(self) -> None:
        super().__init__(None)
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)


def test_builder_keeps_a_gxx_the_toolkit_accepts(tmp_path: Path) -> None:
    env = fake_compilers(tmp_path, {"c++": "12.2.0", "g++-11": "11.3.0", "gcc-11": "11.3.0"})
    assert compiler.gcc_for_toolkit(13, env, Lines()) is None
    assert compiler.gcc_for_toolkit(None, env, Lines()) is None


def test_builder_picks_the_newest_supported_gxx_n(tmp_path: Path) -> None:
    env = fake_compilers(
        tmp_path,
        {
            "c++": "14.2.0",
            "g++-12": "12.4.0",
            "gcc-12": "12.4.0",
            "g++-13": "13.3.0",
            "gcc-13": "13.3.0",
            "g++-14": "14.2.0",
        },
    )
    rep = Lines()
    got = compiler.gcc_for_toolkit(13, env, rep)
    assert got == {
        "cxx": str(tmp_path / "g++-13"),
        "cc": str(tmp_path / "gcc-13"),
        "reason": rep.lines[0][11:],
    }
    assert "is gcc 14, newer than the toolkit accepts (gcc <= 13): using g++-13" in rep.lines[0]


def test_builder_refuses_when_no_supported_gxx_is_installed(tmp_path: Path) -> None:
    env = fake_compilers(tmp_path, {"c++": "14.2.0", "g++-13": "13.3.0"})  # no gcc-13 beside it
    with pytest.raises(BuildFailure) as info:
        compiler.gcc_for_toolkit(13, env, Lines())
    assert info.value.code == EXIT_ENV
    assert "accepts gcc <= 13 and no g++-N/gcc-N with N <= 13 is on PATH" in info.value.message


def test_c_compiler_beside_a_versioned_gxx(tmp_path: Path) -> None:
    fake_compilers(tmp_path, {"g++-13": "13", "gcc-13": "13"})
    assert compiler.c_compiler_for(str(tmp_path / "g++-13")) == str(tmp_path / "gcc-13")
    assert compiler.c_compiler_for(str(tmp_path / "clang++-19")) is None  # no clang-19 there


# ---- the docker backend's base per toolkit


def test_local_base_gives_cuda_12_4_the_standin_and_refuses_other_cuda_12(tmp_path: Path) -> None:
    backend = DockerBackend(project_with(tmp_path, local_base=True, base_images={}), docker="/bin/false")
    assert backend.base_for(Toolkit.parse("cuda13.0")) == (LOCAL_BASE, "pypi")
    assert backend.base_for(Toolkit.parse("cuda12.4")) == (STANDIN, "base")
    with pytest.raises(EnvironmentProblem) as info:
        backend.base_for(Toolkit.parse("cuda12.8"))
    assert "set build.base_images.cuda12.8 or pass --base-image cuda12.8=nvidia/cuda:" in info.value.message
    assert backend.host_gcc(Toolkit.parse("cuda12.4")) == "13"


def test_base_image_option_wins_and_enters_the_identity(tmp_path: Path) -> None:
    project = project_with(tmp_path, local_base=True, base_images={})
    plain = DockerBackend(project, docker="/bin/false")
    image = "nvidia/cuda:12.4.1-devel-ubuntu22.04"
    chosen = DockerBackend(project, docker="/bin/false", base_images={"cuda12.4": image})
    assert chosen.base_for(Toolkit.parse("cuda12.4")) == (image, "base")
    assert '"bases"' in chosen.identity() and '"bases"' not in plain.identity()


def test_registry_base_is_used_by_its_pinned_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docker_dir = tmp_path / "docker"
    docker_dir.mkdir()
    shutil.copy(packaged_docker_dir() / "cuda-builder.Dockerfile", docker_dir)
    pin = "sha256:" + "ab" * 32
    (docker_dir / "bases.toml").write_text(
        f'schema = 1\n[[base]]\nname = "nvidia/cuda:12.4.1-devel-ubuntu22.04"\nkind = "registry"\npin = "{pin}"\n'
    )
    monkeypatch.setenv("ATTNFORGE_DOCKER_DIR", str(docker_dir))
    backend = DockerBackend(project_with(tmp_path), docker="/bin/false")
    with PlainProgressView() as view:
        assert backend.pinned("nvidia/cuda:12.4.1-devel-ubuntu22.04", view).endswith("@" + pin)
        assert (
            backend.pinned("nvidia/cuda:12.8.1-devel-ubuntu22.04", view)
            == "nvidia/cuda:12.8.1-devel-ubuntu22.04"
        )
        assert backend.pinned(STANDIN, view) == STANDIN


def test_base_image_option_is_checked() -> None:
    assert parse_base_images(("cuda12.4=nvidia/cuda:12.4.1-devel-ubuntu22.04",)) == {
        "cuda12.4": "nvidia/cuda:12.4.1-devel-ubuntu22.04"
    }
    for bad in ("cuda12.4", "12.4=x", "cuda12.4="):
        with pytest.raises(ConfigurationError, match="expected TOOLKIT=IMAGE"):
            parse_base_images((bad,))


# ---- generated workflows


def test_cuda12_jobs_build_on_the_listed_devel_base(tmp_path: Path) -> None:
    project = Project(ROOT / "matrix.yaml")
    job = KernelSetJob("k", (cell(),))
    arg, comment = devel_base(job, project) or ("", "")
    assert arg == "cuda12.4=nvidia/cuda:12.4.1-devel-ubuntu22.04" and "docker/bases.toml" in comment
    assert (
        devel_base(KernelSetJob("k", (cell(toolkit=Toolkit.parse("cuda13.0"), torch="2.14.1"),)), project)
        is None
    )
    unlisted = project_with(tmp_path, base_images={"cuda12.4": "registry.example/cuda:12.4"})
    with pytest.raises(ConfigurationError, match="registry.example/cuda:12.4 is not a registry base listed"):
        devel_base(job, unlisted)


def test_python_prefix_falls_back_to_pyenv_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyenv's shims answer only for the active version: python3.99 is found under $PYENV_ROOT/versions."""
    exe = tmp_path / "versions" / "3.99.1" / "bin" / "python3.99"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!/bin/sh\necho {tmp_path / 'versions' / '3.99.1'}\n")  # a test double of an interpreter
    exe.chmod(0o755)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    assert python_prefix("3.99") == tmp_path / "versions" / "3.99.1"
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "none"))
    with pytest.raises(EnvironmentProblem, match="python3.99 is not available on this host"):
        python_prefix("3.99")


def test_python_prefix_takes_the_newest_pyenv_patch_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for patch in ("3.99.9", "3.99.10"):
        exe = tmp_path / "versions" / patch / "bin" / "python3.99"
        exe.parent.mkdir(parents=True)
        exe.write_text(f"#!/bin/sh\necho {tmp_path / 'versions' / patch}\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    assert python_prefix("3.99") == tmp_path / "versions" / "3.99.10"  # by number, not by text


# ---- the stand-in base (pins are data)


def test_standin_is_pinned_data_and_builds_with_the_ca_as_a_secret(tmp_path: Path) -> None:
    s = STANDINS["12.4"]
    assert s.tag == "attnforge-standin/cuda:12.4.1-devel-debian12"
    assert s.stands_in_for == "nvidia/cuda:12.4.1-devel-ubuntu22.04"
    assert all("=" in d for d in s.debs) and any(d.startswith("nvidia-cuda-toolkit=12.4.131") for d in s.debs)
    ca = tmp_path / "ca.crt"
    cmd = build_command(s, base=LOCAL_BASE, tag=s.tag, ca_bundle=ca, docker="docker")
    assert (
        f"id=ca_bundle,src={ca}" in cmd and f"BASE_IMAGE={LOCAL_BASE}" in cmd and "CUDA_SUITE=trixie" in cmd
    )
    assert not any(str(ca) in a for a in cmd if a.startswith("CUDA_") or a.startswith("BASE_"))


def test_spec_carries_max_gcc_through_json() -> None:
    from attnforge.builder.spec import BuildSpec, Source

    spec = BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source("/s.tgz", "0" * 64),
        python="3.11",
        torch="2.6.0",
        build_dir="/b",
        venv_dir="/v",
        output_dir="/o",
        max_gcc=13,
    )
    assert BuildSpec.from_json(spec.to_json()).max_gcc == 13
