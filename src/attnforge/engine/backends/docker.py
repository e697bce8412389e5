"""The docker backend: one builder image per toolkit, one `docker run` per cell (cibuildwheel's model).

Host folders are mounted at the same paths inside the container, so a spec means the same thing in both
places: the cache (sources, build trees, kernel objects, ccache, venvs), the builder script (read-only),
local pip mirrors (read-only), the cell's Python interpreter (read-only), the CA bundle (read-only, at
/run/secrets/ca_bundle) and the index credentials as a netrc (read-only, at /run/secrets/pip_netrc, named by
$NETRC). Nothing secret is ever in an image layer, a spec or a command line: the builder image's CUDA-from-PyPI
step reads the same pip settings as the builds, given as BuildKit secrets (pip.conf, netrc, CA bundle), and index
URLs carry no credentials.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from attnforge.builder.cross import TRIPLES, host_machine
from attnforge.core.docker_cli import DEFAULT_CA, docker_executable
from attnforge.core.errors import BuildError, ConfigurationError, EnvironmentProblem
from attnforge.core.package_files import docker_dir
from attnforge.core.pins import local_base
from attnforge.engine.backends.cuda_standin import STANDINS, ensure_cuda_standin, standin_for
from attnforge.engine.backends.debian_base import BaseImageError, bootstrap_debian_base, image_id
from attnforge.engine.backends.pip_config import PipOptions, constraint_conflict, pip_options
from attnforge.engine.backends.pip_credentials import CONTAINER_NETRC
from attnforge.engine.backends.pipplan import pip_secrets, plan_pip
from attnforge.engine.base_images import is_local_name, load_bases
from attnforge.engine.jobs import BUILDER_DIR, CellJob
from attnforge.engine.progress import ProgressView
from attnforge.engine.resources import BINDING_JOB_GB, GIB, detect_machine
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.project import Project
from attnforge.matrix.rules import host_compiler_problem

BUILDER_MOUNT = "/opt/attnforge"  # the builder package is mounted at /opt/attnforge/builder
LOCAL_BASE = local_base()
CONTAINER_CA = "/run/secrets/ca_bundle"
CUDA_TARGET_DIRS = {"aarch64": "aarch64-linux", "x86_64": "x86_64-linux"}  # nvcc's targets/<dir> per host


def dockerfile_dir() -> Path:
    """attnforge's docker/ folder (package data; ATTNFORGE_DOCKER_DIR overrides): core.package_files."""
    return docker_dir("cuda-builder.Dockerfile")


def python_prefix(version: str) -> Path:
    """The installation prefix of the host's python<version> (mounted read-only into the builder): the one on
    PATH, else pyenv's newest `$PYENV_ROOT/versions/<version>.*` (its shims answer only for the active one)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    release, ft = version.removesuffix("t"), "t" if version.endswith("t") else ""
    found = sorted(
        (
            p
            for p in pyenv.glob(f"{release}.*{ft}/bin/python{version}")
            if ft or not p.parts[-3].endswith("t")
        ),
        key=lambda p: _version_key(p.parts[-3]),
    )
    for exe in [f"python{version}", *(str(p) for p in reversed(found))]:
        try:
            out = subprocess.run(
                [exe, "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            continue
        return Path(out)
    raise EnvironmentProblem(
        f"python{version} is not available on this host; the docker backend mounts the host's interpreter "
        f"(install it, e.g. with pyenv, or use a base image that has python{version})"
    )


def _version_key(text: str) -> tuple[int, ...]:
    """ "3.12.10" -> (3, 12, 10): pyenv folders sorted by number, not by text ("3.14.0t" as 3.14.0)."""
    return tuple(int(x) if x.isdigit() else -1 for x in text.removesuffix("t").split("."))


def build_image(cmd: list[str], log: Path, failure: Callable[[Path, str], str]) -> None:
    """Run a `docker build` line with BuildKit, its output going to `log` (folder made as needed).

    When it fails, raise EnvironmentProblem worded by `failure(log, tail)`, `tail` being the log's last
    12 lines.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.run(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "DOCKER_BUILDKIT": "1"}
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-12:])
        raise EnvironmentProblem(failure(log, tail))


class DockerBackend:
    """Builds cells in containers made from docker/cuda-builder.Dockerfile."""

    name = "docker"

    def __init__(
        self, project: Project, docker: str | None = None, base_images: dict[str, str] | None = None
    ) -> None:
        self.project = project
        self.docker = docker or docker_executable()
        build = project.matrix.build
        self.base_images = {**build.base_images, **(base_images or {})}  # --base-image wins
        self.pip: PipOptions = pip_options(build.pip, base=project.root)
        self.netrc = self.pip.netrc()  # index credentials: a file pip reads, never a URL or argument
        ca = build.extra_ca_bundle or (str(DEFAULT_CA) if DEFAULT_CA.exists() else None)
        self.ca_bundle = project.path(ca) if ca else None
        self.images: dict[str, str] = {}
        self.bases: dict[str, str] = {}  # toolkit -> the base its builder image was made FROM
        self.pip_args = self.pip.args
        self.interpreter: str | None = None
        self._host_pythons: dict[str, Path | None] = {}  # python version -> host prefix (host_venv)

    # ---- images ----
    def base_for(self, toolkit: Toolkit) -> tuple[str, str]:
        """(base image, CUDA_FROM) for a toolkit: --base-image / build.base_images, then with `local_base` the
        local bookworm base (CUDA >= 13 from PyPI) or a local stand-in of the devel image (CUDA 12.4), else
        the compat table's `nvidia/cuda:<ver>-devel` image."""
        if str(toolkit) in self.base_images:
            return self.base_images[str(toolkit)], "base"
        if self.project.matrix.build.local_base:
            if toolkit.major >= 13:
                return LOCAL_BASE, "pypi"
            standin = standin_for(toolkit.version)
            if standin is None:
                raise EnvironmentProblem(
                    f"{toolkit}: PyPI's CUDA {toolkit.major} wheels carry no nvcc and there is no local stand-in "
                    f"for it (only CUDA {', '.join(sorted(STANDINS))}): set build.base_images.{toolkit} "
                    f"or pass --base-image {toolkit}=nvidia/cuda:<{toolkit.version}.x>-devel-ubuntu22.04"
                )
            return standin.tag, "base"
        row = self.project.compat.cuda_toolkit(toolkit.version)
        if row is None or not row.devel_image:
            raise EnvironmentProblem(f"no base image known for {toolkit}: set build.base_images.{toolkit}")
        return row.devel_image, "base"

    def host_gcc(self, toolkit: Toolkit) -> str:
        """HOST_GCC for the builder image: the newest gcc major the toolkit accepts (compat `max_gcc`)."""
        row = self.project.compat.cuda_toolkit(toolkit.version)
        return str(row.max_gcc) if row and row.max_gcc else ""

    def builder_tag(self, toolkit: Toolkit, base: str, cuda_from: str) -> str:
        text = (dockerfile_dir() / "cuda-builder.Dockerfile").read_bytes()
        key = f"{base}|{cuda_from}|{toolkit.version}|{self.host_gcc(toolkit)}"
        digest = hashlib.sha256(text + key.encode()).hexdigest()[:12]
        return f"attnforge/cuda-builder:{toolkit.short}-{digest}"

    def ensure_base(self, base: str, toolkit: Toolkit, view: ProgressView) -> None:
        """Make a missing local base: the bookworm bootstrap, or the toolkit's CUDA stand-in on top of it."""
        if image_id(base, docker=self.docker) is not None:
            return
        standin = standin_for(toolkit.version)
        try:
            if base == LOCAL_BASE:
                view.log(f"bootstrapping the local base image {LOCAL_BASE} (debootstrap, ~1 min)")
                res = bootstrap_debian_base(LOCAL_BASE, docker=self.docker)
                view.log(f"{LOCAL_BASE}: created in {res.seconds} s")
            elif standin is not None and base == standin.tag:
                log = self.logs_dir() / f"standin-{toolkit.short}.log"
                made = ensure_cuda_standin(
                    toolkit.version, ca_bundle=self.ca_bundle, log_path=log, docker=self.docker, say=view.log
                )
                view.log(f"{made.tag}: created in {made.seconds} s (a stand-in, NOT an NVIDIA image)")
        except BaseImageError as exc:
            raise EnvironmentProblem(f"cannot make the local base image {base}: {exc}") from None

    def logs_dir(self) -> Path:
        return self.project.path(self.project.matrix.build.output_dir) / "logs"

    def pinned(self, base: str, view: ProgressView) -> str:
        """`name@digest` for a registry base that docker/bases.toml pins; other bases as they are (logged)."""
        if "@" in base or is_local_name(base):
            return base
        rec = load_bases(dockerfile_dir() / "bases.toml").get(base)
        if rec is not None and rec.kind == "registry" and rec.pin:
            return f"{base}@{rec.pin}"
        view.log(
            f"base {base} is not digest-pinned in docker/bases.toml (`attnforge images bases --update {base}`)"
        )
        return base

    def ensure_builder(self, toolkit: Toolkit, view: ProgressView) -> str:
        base, cuda_from = self.base_for(toolkit)
        problem = host_compiler_problem(toolkit, base, self.project.compat)
        if problem is not None:
            raise EnvironmentProblem(f"[{problem.rule}] {problem.message}")
        self.ensure_base(base, toolkit, view)
        base = self.pinned(base, view)
        self.bases[str(toolkit)] = base
        tag = self.builder_tag(toolkit, base, cuda_from)
        if image_id(tag, docker=self.docker):
            return tag
        view.log(f"building builder image {tag} (base {base}, CUDA {toolkit.version} from {cuda_from})")
        self.build_builder(toolkit, base, cuda_from, tag, view)
        return tag

    def build_builder(
        self,
        toolkit: Toolkit,
        base: str,
        cuda_from: str,
        tag: str,
        view: ProgressView,
        *,
        no_cache: bool = False,
        log: Path | None = None,
    ) -> None:
        """`docker build` the cuda-builder image `tag` (BuildKit), its output in `log` (default:
        `<output>/logs/builder-<cuNNN>.log`); `no_cache`: every step runs again (no layer from BuildKit's cache)."""
        cmd = [self.docker, "build", *(["--no-cache"] if no_cache else []), "-f"]
        cmd += [str(dockerfile_dir() / "cuda-builder.Dockerfile"), "--build-arg", f"BASE_IMAGE={base}"]
        cmd += ["--build-arg", f"CUDA_FROM={cuda_from}", "--build-arg", f"CUDA_VERSION={toolkit.version}"]
        cmd += ["--build-arg", f"HOST_GCC={self.host_gcc(toolkit)}", "--network", "host", "-t", tag]
        log = log or self.logs_dir() / f"builder-{toolkit.short}.log"
        plan = plan_pip(torch_index=None, options=self.pip)
        for note in plan.notes:
            view.log(f"builder image {tag}: {note}")
        # the CUDA wheels come through the builds' own pip settings: pip.conf, netrc and CA bundle as BuildKit
        # secrets (local mirrors served on 127.0.0.1 meanwhile), never a build argument or a layer
        with pip_secrets(plan, ca_bundle=self.ca_bundle, netrc=self.netrc.path()) as secrets:
            for ident, path in sorted(secrets.items()):
                cmd += ["--secret", f"id={ident},src={path}"]
            cmd.append(str(dockerfile_dir()))
            build_image(
                cmd,
                log,
                lambda log, tail: f"building the {toolkit} builder image failed (log {log}):\n{tail}",
            )

    def ensure_cross(self, toolkit: Toolkit, target: str, view: ProgressView) -> str:
        """The toolkit's builder image plus the GNU cross toolchain for `target` (docker/cuda-cross.Dockerfile):
        what a cell of another host architecture than this machine's compiles in (builder/cross.py)."""
        builder = self.images[str(toolkit)]
        triple = TRIPLES[target]
        text = (dockerfile_dir() / "cuda-cross.Dockerfile").read_bytes()
        digest = hashlib.sha256(text + f"{builder}|{triple}|{toolkit.version}".encode()).hexdigest()[:12]
        tag = f"attnforge/cuda-cross:{toolkit.short}-{target}-{digest}"
        if image_id(tag, docker=self.docker):
            return tag
        view.log(f"building cross image {tag} ({builder} + g++-{triple})")
        cmd = [self.docker, "build", "-f", str(dockerfile_dir() / "cuda-cross.Dockerfile")]
        cmd += ["--build-arg", f"BUILDER_IMAGE={builder}", "--build-arg", f"CROSS_TRIPLE={triple}"]
        cmd += ["--build-arg", f"CUDA_TARGET_DIR={CUDA_TARGET_DIRS[target]}"]
        cmd += [
            "--build-arg",
            f"PIP_PLATFORM=manylinux2014_{target}",
            "--build-arg",
            f"CUDA_VERSION={toolkit.version}",
        ]
        cmd += ["--network", "host", "-t", tag]
        if self.ca_bundle:
            cmd += ["--secret", f"id=ca_bundle,src={self.ca_bundle}"]
        cmd.append(str(dockerfile_dir()))
        log = self.logs_dir() / f"cross-{toolkit.short}-{target}.log"
        build_image(
            cmd, log, lambda log, tail: f"building the {target} cross image failed (log {log}):\n{tail}"
        )
        return tag

    def image_key(self, cell: Cell) -> str:
        """Which image a cell runs in: its toolkit's builder, or that builder's cross image for its platform."""
        native = cell.platform == host_machine() or cell.pure_python
        return str(cell.toolkit) if native else f"{cell.toolkit}/{cell.platform}"

    def prepare(self, cells: list[Cell], view: ProgressView) -> None:
        for note in self.pip.notes:
            view.log(note)
        for c in cells:
            conflict = None if c.pure_python else constraint_conflict(self.pip, c.torch)
            if conflict:
                raise ConfigurationError(f"{c.id}: {conflict}")
        for toolkit in sorted({c.toolkit for c in cells}, key=str):
            if toolkit.kind != "cuda":
                raise BuildError(
                    f"{toolkit}: the docker backend builds CUDA cells; ROCm cells need docker/rocm-builder"
                )
            self.images[str(toolkit)] = self.ensure_builder(toolkit, view)
        for c in cells:
            key = self.image_key(c)
            if key not in self.images:
                self.images[key] = self.ensure_cross(c.toolkit, c.platform, view)
        for py in sorted({c.python for c in cells}):
            python_prefix(py)

    def image_of(self, cell: Cell) -> dict[str, str | None]:
        """The builder image a cell ran in, its id (the digest the provenance records) and its base."""
        tag = self.images.get(self.image_key(cell))
        ident = image_id(tag, docker=self.docker) if tag else None
        return {"image": tag, "image_id": ident, "base": self.bases.get(str(cell.toolkit))}

    def identity(self) -> str:
        ident: dict[str, object] = {"backend": "docker", "dockerfile": self._dockerfile_digest()}
        if self.base_images:  # another base is another wheel (absent when unset: older hashes still hold)
            ident["bases"] = self.base_images
        return json.dumps(ident, sort_keys=True)

    def _dockerfile_digest(self) -> str:
        try:
            return hashlib.sha256((dockerfile_dir() / "cuda-builder.Dockerfile").read_bytes()).hexdigest()[
                :16
            ]
        except EnvironmentProblem:
            return "missing"

    # ---- running ----
    def pip_env(self, in_container: bool) -> dict[str, str]:
        """pip's settings for a build's venv: no pip config file (the matrix's pip options are the only ones),
        the index credentials as a netrc pip's requests reads through $NETRC (never in a URL, argument or spec)
        and the CA bundle, at their paths in the container or on the host."""
        env = {"PIP_CONFIG_FILE": "/dev/null"}
        netrc = self.netrc.path()
        if netrc is not None:
            env["NETRC"] = CONTAINER_NETRC if in_container else str(netrc)
        if self.ca_bundle:
            ca = CONTAINER_CA if in_container else str(self.ca_bundle)
            env |= {k: ca for k in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")}
        return env

    def host_venv(self, cell: Cell) -> tuple[str, dict[str, str]] | None:
        """The interpreter and environment with which the host makes ``cell``'s torch venv so that its container
        reuses it (``engine.venv_ahead``): the mounted Python by the path the container finds it at, the same pip
        settings. None for a cross-compiled cell (its venv holds the target's wheels), a Python not found, or a
        torch the site's pip constraint excludes (`prepare` names it)."""
        if cell.platform != host_machine() or cell.pure_python or constraint_conflict(self.pip, cell.torch):
            return None
        if cell.python not in self._host_pythons:  # one interpreter query per Python, not per cell
            try:
                self._host_pythons[cell.python] = python_prefix(cell.python)
            except EnvironmentProblem:
                self._host_pythons[cell.python] = None
        prefix = self._host_pythons[cell.python]
        python = prefix / "bin" / f"python{cell.python}" if prefix else None
        if python is None or not python.is_file():
            return None
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env |= {
            "PATH": f"{prefix}/bin{os.pathsep}{os.environ.get('PATH', '')}",
            **self.pip_env(in_container=False),
        }
        return str(python), env

    def container_name(self, job: CellJob) -> str:
        """One name per (build cache, cell): two projects (or checkouts) building the same cell on one engine
        get two containers instead of a name conflict."""
        cache = self.project.path(self.project.matrix.build.cache_dir)
        return "attnforge-" + hashlib.sha256(f"{cache}|{job.cell.id}".encode()).hexdigest()[:16]

    def run_command(self, job: CellJob) -> list[str]:
        """The `docker run` line for a cell (exposed for --dry-run and tests)."""
        cache = self.project.path(self.project.matrix.build.cache_dir)
        prefix = python_prefix(job.cell.python)
        mounts = [
            f"{cache}:{cache}",
            f"{BUILDER_DIR}:{BUILDER_MOUNT}/builder:ro",
            f"{prefix}:{prefix}:ro",
            f"{Path(job.spec.source.path).parent}:{Path(job.spec.source.path).parent}:ro",
        ]
        mounts += [f"{p}:{p}:ro" for p in self.pip.local_paths if p.exists()]
        env = {
            "PYTHONUNBUFFERED": "1",
            "PATH": f"{prefix}/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            **self.pip_env(in_container=True),
        }
        netrc = self.netrc.path()
        if netrc is not None:
            mounts.append(f"{netrc}:{CONTAINER_NETRC}:ro")
        if self.ca_bundle:
            mounts.append(f"{self.ca_bundle}:{CONTAINER_CA}:ro")
        if job.memory_limit_gb is not None:
            limit_gb = job.memory_limit_gb
        else:
            # MAX_JOBS compilers, the binding that may join a kernel lane, 2 GiB for the rest
            limit_gb = job.settings.job_memory_gb * (job.spec.max_jobs or 1) + BINDING_JOB_GB + 2.0
            limit_gb = min(limit_gb, detect_machine().memory_available_gb) if job.settings.fits else limit_gb
        memory = f"{int(limit_gb * GIB)}"
        cmd = [self.docker, "run", "--rm", "--name", self.container_name(job), "--network", "host"]
        cmd += ["--workdir", BUILDER_MOUNT]  # `python -m builder` finds the package there
        cmd += ["--memory", memory, "--memory-swap", memory]  # no swap: an OOM kill, never thrashing
        for m in mounts:
            cmd += ["-v", m]
        for k, v in sorted(env.items()):
            cmd += ["-e", f"{k}={v}"]
        cmd += [self.images.get(self.image_key(job.cell), "attnforge/cuda-builder")]
        cmd += [f"{prefix}/bin/python{job.cell.python}", "-m", "builder", "--spec", str(job.spec_path)]
        return cmd

    def run(self, job: CellJob, on_line: Callable[[str], None]) -> int:
        proc = subprocess.Popen(
            self.run_command(job), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                on_line(line)
        finally:
            code = proc.wait()
        return code

    def cancel(self, job: CellJob) -> None:
        subprocess.run([self.docker, "kill", self.container_name(job)], capture_output=True, check=False)
