"""The cibuildwheel backend's image: docker/manylinux-cuda.Dockerfile on top of the docker backend's builder.

The manylinux-like layer adds what cibuildwheel's Linux mode looks for (/opt/python/cpXY-cpXY, its helper
Python, auditwheel, patchelf, AUDITWHEEL_PLAT for the base's glibc). One image per toolkit and set of
Pythons, tagged by a digest of the Dockerfile, the builder image's id, the CUDA version, the Pythons and
the glibc; built once (log `<output>/logs/manylinux-<toolkit>.log`) and used without pulling.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from ..cell import Cell, Toolkit
from ..errors import EnvironmentProblem
from .base_image import image_id
from .docker_backend import DockerBackend, build_image, dockerfile_dir
from .progress import ProgressView

DOCKERFILE = "manylinux-cuda.Dockerfile"
IMAGE_REPO = "attnforge/manylinux-cuda"


class ManylinuxImages:
    """Builds and inspects the manylinux-like images on `builder`'s CUDA images, logging under `logs`."""

    def __init__(self, builder: DockerBackend, logs: Path) -> None:
        self.builder = builder  # the base image, the docker CLI and the CA bundle
        self.docker = builder.docker
        self.logs = logs

    def base_glibc(self, base: str) -> str:
        """The base image's glibc as a manylinux policy suffix (2.36 -> '2_36'): the image's target."""
        proc = subprocess.run(
            [self.docker, "run", "--rm", "--network", "none", base, "ldd", "--version"],
            capture_output=True,
            text=True,
            check=False,
        )
        found = re.search(r"(\d+)\.(\d+)\s*$", (proc.stdout.strip().splitlines() or [""])[0])
        if not found:
            raise EnvironmentProblem(f"cannot read the glibc version of {base}: {proc.stderr.strip()[-300:]}")
        return f"{found.group(1)}_{found.group(2)}"

    def image_tag(self, toolkit: Toolkit, base: str, pythons: list[str], glibc: str) -> str:
        text = (dockerfile_dir() / DOCKERFILE).read_bytes()
        key = f"{image_id(base, docker=self.docker)}|{toolkit.version}|{' '.join(pythons)}|{glibc}".encode()
        return f"{IMAGE_REPO}:{toolkit.short}-{hashlib.sha256(text + key).hexdigest()[:12]}"

    def ensure_image(
        self, toolkit: Toolkit, pythons: list[str], cells: list[Cell], view: ProgressView
    ) -> str:
        """The manylinux-like image for a toolkit and these Pythons (built once, on the CUDA builder)."""
        base = self.builder.ensure_builder(toolkit, view)
        glibc = self.base_glibc(base)
        tag = self.image_tag(toolkit, base, pythons, glibc)
        if image_id(tag, docker=self.docker):
            return tag
        view.log(
            f"building manylinux-like image {tag} (base {base}, glibc {glibc}, Pythons {' '.join(pythons)})"
        )
        cmd = [self.docker, "build", "-f", str(dockerfile_dir() / DOCKERFILE), "--network", "host"]
        args = [f"BASE_IMAGE={base}", f"CUDA_VERSION={toolkit.version}", f"PYTHONS={' '.join(pythons)}"]
        for arg in (*args, f"MANYLINUX_GLIBC={glibc}"):
            cmd += ["--build-arg", arg]
        if self.builder.ca_bundle:
            cmd += ["--secret", f"id=ca_bundle,src={self.builder.ca_bundle}"]
        cmd += ["-t", tag, str(dockerfile_dir())]
        ids = ", ".join(c.id for c in cells)
        build_image(
            cmd,
            self.logs / f"manylinux-{toolkit.short}.log",
            lambda log, tail: f"{ids}: building the manylinux-like image {tag} failed; log: {log}\n{tail}",
        )
        return tag

    def image_toolchain(self, tag: str, python: str) -> dict[str, str | None]:
        """nvcc, g++ and Python versions inside the image (for the manifest's toolchain)."""
        cp = "cp" + python.replace(".", "")
        script = f"nvcc --version | tail -n 2; c++ -dumpfullversion; /opt/python/{cp}-{cp}/bin/python -V"
        proc = subprocess.run(
            [self.docker, "run", "--rm", "--network", "none", tag, "bash", "-c", script],
            capture_output=True,
            text=True,
            check=False,
        )
        out = proc.stdout
        nvcc = re.search(r"V(\d+\.\d+\.\d+)", out)
        gcc = re.search(r"^(\d+\.\d+\.\d+)$", out, re.M)
        py = re.search(r"Python (\d+\.\d+\.\d+)", out)
        return {
            "nvcc": nvcc.group(1) if nvcc else None,
            "gcc": gcc.group(1) if gcc else None,
            "python": py.group(1) if py else None,
        }
