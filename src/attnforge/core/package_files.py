"""The files attnforge ships inside its package (package data), found through importlib.resources.

The Dockerfiles and their build contexts (`attnforge/docker/`: cuda-builder.Dockerfile, bases.toml,
cuda-standin/, ngc-standin/, ...) are the one folder every docker user of the tool needs on disk: this module is
the only place that finds it. An installed attnforge (`pipx install attnforge`) and a source checkout find the
same folder. `ATTNFORGE_DOCKER_DIR` names another folder laid out the same way (a site's own Dockerfiles or
pins); it replaces the packaged one as a whole.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from attnforge.core.errors import EnvironmentProblem

DOCKER_DIR_ENV = "ATTNFORGE_DOCKER_DIR"


def packaged_docker_dir() -> Path:
    """attnforge's own docker/ folder (package data); a real folder: setuptools installs package data as files."""
    root = resources.files("attnforge").joinpath("docker")
    return Path(str(root))


def docker_dir(needs: str = "cuda-builder.Dockerfile") -> Path:
    """The folder of Dockerfiles and build contexts: `$ATTNFORGE_DOCKER_DIR`, else the packaged one.
    EnvironmentProblem when `needs` (a file or folder relative to it) is not there."""
    override = os.environ.get(DOCKER_DIR_ENV)
    path = Path(override) if override else packaged_docker_dir()
    if not (path / needs).exists():
        hint = (
            f"{DOCKER_DIR_ENV} must name a folder laid out like attnforge/docker"
            if override
            else f"this attnforge installation lacks its package data: reinstall it, or set {DOCKER_DIR_ENV}"
        )
        raise EnvironmentProblem(f"no {needs} under {path}: {hint}")
    return path


def inside_installed_package(path: Path) -> bool:
    """Whether ``path`` lies in an installed distribution (site-packages, dist-packages), not a source checkout:
    a file written there is lost on upgrade and shared by every project using that installation."""
    return any(part in ("site-packages", "dist-packages") for part in path.resolve().parts)
