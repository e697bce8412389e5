"""`build_image` (shared by the docker and cibuildwheel backends) and the builder image's failure report.

No Docker engine: a fake `docker` script answers `image inspect` and fails `build` with a long log.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.engine.backends.docker import LOCAL_BASE, DockerBackend, build_image
from attnforge.engine.backends.pip_config import constraint_conflict, pip_options
from attnforge.engine.progress import PlainProgressView
from attnforge.matrix.cell import Toolkit
from attnforge.matrix.project import Project

ROOT = Path(__file__).resolve().parents[2]
MINI = str(ROOT / "tests" / "data" / "compat_mini.toml")


def fake_docker(tmp_path: Path, images: list[str]) -> Path:
    """A `docker` that knows `images`, fails every build after 20 lines, and records its arguments."""
    script = tmp_path / "docker"
    known = " ".join(shlex.quote(i) for i in images)
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(tmp_path / "calls"))}\n'
        'case "$1" in\n'
        "  image) for i in " + known + '; do [ "$5" = "$i" ] && echo "sha256:$i" && exit 0; done; exit 1;;\n'
        '  build) for a in "$@"; do case "$a" in id=pip_conf,src=*) cat "${a#id=pip_conf,src=}" >> '
        f"{shlex.quote(str(tmp_path / 'pip.conf.seen'))};; esac; done\n"
        '    for n in $(seq 1 20); do echo "step $n"; done; echo "BUILDKIT=$DOCKER_BUILDKIT" >&2; exit 1;;\n'
        "  run) echo 'ldd (Debian GLIBC 2.36-9+deb12u4) 2.36'; exit 0;;\n"
        "esac\n"
        "exit 2\n"
    )
    script.chmod(0o755)
    return script


def test_build_image_logs_with_buildkit(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "x.log"  # the folder is made
    cmd = [sys.executable, "-c", "import os; print('BUILDKIT=' + os.environ['DOCKER_BUILDKIT'])"]
    build_image(cmd, log, lambda log, tail: pytest.fail(f"no failure expected: {tail}"))
    assert log.read_text() == "BUILDKIT=1\n"


def test_build_image_failure_carries_the_logs_tail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("an older build's log\n")  # overwritten, not appended to
    code = "import sys\nfor n in range(20): print(f'line {n}', file=sys.stderr)\nsys.exit(3)"
    with pytest.raises(EnvironmentProblem) as info:
        build_image([sys.executable, "-c", code], log, lambda log, tail: f"it failed; log: {log}\n{tail}")
    tail = "\n".join(f"line {n}" for n in range(8, 20))
    assert info.value.message == f"it failed; log: {log}\n{tail}"
    assert type(info.value) is EnvironmentProblem and "older" not in log.read_text()


def test_builder_image_failure_message(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"] |= {"output_dir": str(tmp_path / "wheels"), "local_base": True, "base_images": {}}
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    backend = DockerBackend(Project(tmp_path / "matrix.yaml", MINI), str(fake_docker(tmp_path, [LOCAL_BASE])))
    toolkit = Toolkit("cuda", "13.0")
    with pytest.raises(EnvironmentProblem) as info, PlainProgressView() as view:
        backend.ensure_builder(toolkit, view)
    log = tmp_path / "wheels" / "logs" / "builder-cu130.log"
    tail = "\n".join([*(f"step {n}" for n in range(10, 21)), "BUILDKIT=1"])
    assert info.value.message == f"building the cuda13.0 builder image failed (log {log}):\n{tail}"
    build = next(c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("build "))
    assert f"BASE_IMAGE={LOCAL_BASE}" in build and "-t attnforge/cuda-builder:cu130-" in build
    assert "id=pip_conf,src=" in build and "PIP_INDEX_URL" not in build


def test_the_cuda_step_gets_the_builds_pip_settings_as_secrets(tmp_path: Path) -> None:
    """The builder image's CUDA-from-PyPI step reads build.pip: the index in a pip.conf secret, the password in
    the netrc secret; neither is on the `docker build` line (build arguments land in `docker history`)."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine idx.example login forge password SECRET-0123456789abcdef\n")
    netrc.chmod(0o600)
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"] |= {"output_dir": str(tmp_path / "wheels"), "local_base": True, "base_images": {}}
    data["build"]["pip"] = {
        "inherit_host_config": False,
        "index_url": "https://idx.example/simple/",
        "extra_index_urls": ["https://mirror.example/simple/"],
        "netrc": str(netrc),
    }
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    backend = DockerBackend(Project(tmp_path / "matrix.yaml", MINI), str(fake_docker(tmp_path, [LOCAL_BASE])))
    with pytest.raises(EnvironmentProblem), PlainProgressView() as view:
        backend.ensure_builder(Toolkit("cuda", "13.0"), view)
    build = next(c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("build "))
    assert f"id=pip_netrc,src={netrc}" in build and "id=pip_conf,src=" in build
    assert "SECRET-" not in build and "idx.example" not in build and "PIP_INDEX_URL" not in build
    conf = (tmp_path / "pip.conf.seen").read_text()
    assert "index-url = https://idx.example/simple/" in conf
    assert "extra-index-url = https://mirror.example/simple/" in conf and "SECRET-" not in conf


def test_a_site_constraint_that_excludes_the_cells_torch_is_named_before_any_image(tmp_path: Path) -> None:
    """A machine whose pip config caps torch (a site-wide constraints file) cannot make a newer torch's venv:
    the build says so, naming the file and the line, before a builder image is made."""
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# site policy\ntorch<=2.14.1\nnumpy<3\n")
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"] |= {"output_dir": str(tmp_path / "wheels"), "local_base": True, "base_images": {}}
    data["build"]["pip"] = {"inherit_host_config": True}
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    project = Project(tmp_path / "matrix.yaml", MINI)
    backend = DockerBackend(project, str(fake_docker(tmp_path, [LOCAL_BASE])))
    backend.pip = pip_options(project.matrix.build.pip, inherit={"constraint": str(constraints)})
    cell = project.plan("default").valid[0]
    newer = replace(cell, torch="2.15.0")
    with pytest.raises(ConfigurationError) as err, PlainProgressView() as view:
        backend.prepare([newer], view)
    assert str(constraints) in str(err.value) and "torch<=2.14.1" in str(err.value)
    assert "torch==2.15.0" in str(err.value) and "inherit_host_config: false" in str(err.value)
    assert not (tmp_path / "calls").exists()  # nothing was asked of docker
    assert backend.host_venv(newer) is None  # and no venv is tried ahead of the images for that torch
    assert constraint_conflict(backend.pip, cell.torch) is None  # the cell's own torch 2.14.1 is allowed
