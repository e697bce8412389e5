"""One docker setting (`core.docker_cli.docker_executable`): with ATTNFORGE_DOCKER set, every call site runs
that CLI (backend choice, the docker backend, Debian base and CUDA stand-in images, `cache`, the runner)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from attnforge.cli.commands import cache as cache_cmd
from attnforge.core import docker_cli
from attnforge.core.docker_cli import DEFAULT_DOCKER, Docker, docker_executable
from attnforge.engine.backends import cuda_standin, debian_base
from attnforge.engine.backends.choice import docker_engine_ok
from attnforge.engine.backends.docker import DockerBackend
from attnforge.matrix.project import Project
from attnforge.runner.checks import CheckOptions, check_docker

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A docker CLI that records its arguments and answers `version`; ATTNFORGE_DOCKER points at it."""
    script = tmp_path / "my-docker"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n[ "$1" = version ] && echo 27.1 && exit 0\nexit 1\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("ATTNFORGE_DOCKER", str(script))
    return script


def calls(fake: Path) -> list[str]:
    log = fake.parent / "calls"
    return log.read_text().splitlines() if log.exists() else []


def test_default_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNFORGE_DOCKER", raising=False)
    assert docker_executable() == DEFAULT_DOCKER == Docker().docker
    assert docker_executable(default="docker") == "docker"


def test_every_call_site_runs_attnforge_docker(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert docker_executable() == str(fake) == Docker().docker
    assert docker_engine_ok() == (True, "27.1")
    assert DockerBackend(Project(ROOT / "matrix.yaml")).docker == str(fake)
    assert debian_base.image_id("some/image:tag") is None
    assert calls(fake)[-1] == "image inspect --format {{.Id}} some/image:tag"
    standin = next(iter(cuda_standin.STANDINS.values()))
    assert cuda_standin.build_command(standin, base="b", tag="t", ca_bundle=None)[0] == str(fake)

    asked: list[str] = []
    monkeypatch.setattr(cache_cmd, "_docker_inventory", lambda docker: asked.append(docker) or [])
    cache_cmd._prune_docker(Console(quiet=True), dry_run=True)
    assert asked == [str(fake)]

    class Host:
        def which(self, name: str) -> str | None:
            asked.append(name)
            return None

    opts = CheckOptions(None, [], None, tmp_path)
    check_docker(Host(), None, opts)  # type: ignore[arg-type]
    assert asked[-1] == str(fake)
    assert docker_cli.DOCKER_ENV == "ATTNFORGE_DOCKER"
