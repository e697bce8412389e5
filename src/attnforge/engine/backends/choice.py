"""Pick the build backend: docker when an engine answers (default), else local; say which and why."""

from __future__ import annotations

import subprocess

from attnforge.core.docker_cli import docker_executable
from attnforge.core.errors import EnvironmentProblem
from attnforge.engine.backends.docker import DockerBackend
from attnforge.engine.backends.local import LocalBackend
from attnforge.engine.jobs import Backend
from attnforge.engine.progress import ProgressView
from attnforge.matrix.project import Project


def docker_engine_ok(docker: str | None = None) -> tuple[bool, str]:
    """(True, version) when `docker info` answers, else (False, the reason); `docker_executable()` by default."""
    docker = docker or docker_executable()
    try:
        proc = subprocess.run(
            [docker, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, timeout=20
        )
    except FileNotFoundError:
        return False, f"{docker} not found (apt-get install docker.io)"
    except subprocess.TimeoutExpired:
        return False, "the Docker engine did not answer within 20 s"
    if proc.returncode != 0:
        return False, (proc.stderr.strip().splitlines() or ["no engine"])[-1]
    return True, proc.stdout.strip()


def choose_backend(
    project: Project, name: str, view: ProgressView, base_images: dict[str, str] | None = None
) -> Backend:
    """Instantiate the backend `name` (auto/docker/local); `base_images` (--base-image) go to docker."""
    if name in ("auto", "docker"):
        ok, detail = docker_engine_ok()
        if ok:
            view.log(f"backend: docker (engine {detail})")
            backend: Backend = DockerBackend(project, base_images=base_images)
            return backend
        if name == "docker":
            raise EnvironmentProblem(
                f"no Docker engine reachable: {detail}. Install Docker and start its engine (Debian/Ubuntu: "
                "apt-get install docker.io, then start the docker service), or build on this host with "
                "--backend local (its CUDA toolkit and compiler; `attnforge docs build`)"
            )
        view.log(f"backend: local (no Docker engine: {detail})")
    else:
        view.log("backend: local")
    if base_images:
        view.log(f"--base-image ignored: the {name} backend builds on this host, not on a base image")
    return LocalBackend()
