"""The cibuildwheel backend: attnforge prepares the tree, cibuildwheel builds, repairs and tests the wheel.

Per cell: the sdist is unpacked and patched on the host exactly as `incontainer.py` does for the docker
backend (same patches, same setup hook), then `cibuildwheel --platform linux` runs on that tree with a
generated `[tool.cibuildwheel]` config (`attnforge.ci.cibuildwheel_config`): a manylinux-like image built
locally on top of the docker backend's CUDA builder (docker/manylinux-cuda.Dockerfile, built by
`cibuildwheel_image`), torch from this machine's pip mirrors in before-build, the builder's own knobs
(MAX_JOBS, NVCC_THREADS, ATTNFORGE_*) in `environment`, `auditwheel repair` excluding torch's libraries, an
import test in a fresh venv. The wheel then goes through the engine's finalize and manifest like any other
backend's.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.version import Version

from ..cell import Cell
from ..ci.cibuildwheel_config import IMPORT_MARKER, cibuildwheel_config, to_toml
from ..errors import BuildError, EnvironmentProblem
from ..project import Project
from . import incontainer
from .cibuildwheel_image import DOCKERFILE, IMAGE_REPO, ManylinuxImages
from .docker_backend import DOCKER, DockerBackend, dockerfile_dir
from .engine import CellJob
from .incontainer_api import (
    EXIT_BAD_SPEC,
    EXIT_COMPILE_ERROR,
    EXIT_ENVIRONMENT,
    EXIT_IMPORT,
    EXIT_OOM,
)
from .progress import BUILDER_STAGES, ProgressView
from .resources import GIB, detect_machine

CIBUILDWHEEL_VERSION = "4.3.3"  # the pin in pyproject's `cibuildwheel` and `dev` extras
CONTAINER_PROJECT = "/project"  # where cibuildwheel copies the tree inside its container
AUTO_CCACHE_TORCH = Version("2.14")  # torch's cpp_extension puts ccache in front of c++ and nvcc itself
CA_IN_CONTAINER = "/run/secrets/ca_bundle"
# incontainer.build_env's knobs that decide the compile (paths and the toolkit location are the image's)
KNOBS = (
    "MAX_JOBS",
    "NVCC_THREADS",
    "TORCH_CUDA_ARCH_LIST",
    "SOURCE_DATE_EPOCH",
    "NVCC_APPEND_FLAGS",
    "FLASH_ATTENTION_FORCE_BUILD",
    "FLASH_ATTENTION_SKIP_CUDA_BUILD",
    "BUILD_TARGET",
    "FLASH_ATTN_CUDA_ARCHS",
    "FLASH_ATTENTION_FORCE_CXX11_ABI",
    "FLASH_ATTN_LOCAL_VERSION",
    "ATTNFORGE_DEFINES",
    "ATTNFORGE_HEAD_DIMS",
    "ATTNFORGE_DTYPES",
    "ATTNFORGE_DROP_BACKWARD",
    "TORCH_NO_COMPILER_WRAPPER",
    "PYTORCH_NVCC",
)
# cibuildwheel's step titles (logger.step) -> attnforge's stage names (progress.BUILDER_STAGES + repair)
STEPS = {
    "Starting container image": "container",
    "Copying project into container...": "container",
    "Running before_all...": "toolkit",
    "Running before_build...": "venv",
    "Building wheel...": "compile",
    "Repairing wheel...": "repair",
    "Testing wheel...": "import_check",
    "Copying wheels back to host...": None,
}
ERROR_HINT = re.compile(r"(error|failed|No matching distribution|not found|denied)", re.IGNORECASE)
PIP_FLAGS = {
    "--index-url": "PIP_INDEX_URL",
    "--extra-index-url": "PIP_EXTRA_INDEX_URL",
    "--find-links": "PIP_FIND_LINKS",
    "--constraint": "PIP_CONSTRAINT",
}


def pip_env_from_args(args: list[str]) -> dict[str, str]:
    """pip's command-line options as PIP_* variables (repeated options joined by spaces)."""
    env: dict[str, list[str]] = {}
    for flag, value in zip(args[::2], args[1::2], strict=False):
        if flag not in PIP_FLAGS:
            raise BuildError(f"pip option {flag} cannot be passed to cibuildwheel's container")
        env.setdefault(PIP_FLAGS[flag], []).append(value)
    return {key: " ".join(values) for key, values in env.items()}


def _same_major_here() -> bool:
    """This interpreter has cibuildwheel of the pinned major version."""
    if importlib.util.find_spec("cibuildwheel") is None:
        return False
    return importlib.metadata.version("cibuildwheel").split(".")[0] == CIBUILDWHEEL_VERSION.split(".")[0]


def _probe(cmd: list[str], python: str | None) -> tuple[str | None, str]:
    """(version or None, problem): `cmd --help` must work; the version comes from `python`'s metadata."""
    try:
        proc = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{cmd[0]}: {exc}"
    if proc.returncode != 0:
        return None, f"{' '.join(cmd)} --help exited {proc.returncode}"
    if python is None:
        return "unknown", ""
    code = "import importlib.metadata as m; print(m.version('cibuildwheel'))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False).stdout.strip()
    return out or "unknown", ""


def find_cibuildwheel(tools_dir: Path) -> tuple[list[str], str]:
    """(command, version): $ATTNFORGE_CIBUILDWHEEL, this interpreter's, or the pinned one in `tools_dir`.

    The last is installed on first use with this machine's pip config (`nox -s build-wheels` installs
    attnforge without extras). Raises EnvironmentProblem when none works.
    """
    override = os.environ.get("ATTNFORGE_CIBUILDWHEEL")
    venv = tools_dir / f"cibuildwheel-{CIBUILDWHEEL_VERSION}"
    candidates: list[tuple[list[str], str | None]] = []
    if override:
        candidates.append(([override], None))
    else:
        if _same_major_here():
            candidates.append(([sys.executable, "-m", "cibuildwheel"], sys.executable))
        candidates.append(([str(venv / "bin" / "cibuildwheel")], str(venv / "bin" / "python")))
    problems = []
    for cmd, python in candidates:
        if python is not None and python.startswith(str(venv)):
            problem = _install_cibuildwheel(venv)
            if problem:
                problems.append(problem)
                continue
        version, problem = _probe(cmd, python)
        if version:
            return cmd, version
        problems.append(problem)
    raise EnvironmentProblem(
        "cibuildwheel is not available: " + "; ".join(problems),
        hint=f"pip install 'attnforge[cibuildwheel]' (cibuildwheel=={CIBUILDWHEEL_VERSION})",
    )


def _install_cibuildwheel(venv: Path) -> str | None:
    """Install the pinned cibuildwheel into `venv` (a marker file says it finished); the reason when not."""
    marker = venv / ".attnforge-complete"
    if marker.exists():
        return None
    subprocess.run(["rm", "-rf", str(venv)], check=False)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", f"cibuildwheel=={CIBUILDWHEEL_VERSION}"],
    ]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            subprocess.run(["rm", "-rf", str(venv)], check=False)
            return f"installing cibuildwheel=={CIBUILDWHEEL_VERSION} failed: {proc.stderr.strip()[-300:]}"
    marker.write_text(CIBUILDWHEEL_VERSION)
    return None


class _Relay(incontainer.Reporter):
    """incontainer's reporter, writing to the engine's line callback instead of stdout."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        super().__init__(None)
        self.on_line = on_line

    def line(self, text: str) -> None:
        self.on_line(text)


class StepTracker:
    """Turns cibuildwheel's step titles into attnforge stage events with their durations."""

    def __init__(self, rep: incontainer.Reporter) -> None:
        self.rep = rep
        self.stages: dict[str, float] = {}
        self.current: str | None = None
        self.started = 0.0
        self.tail: deque[str] = deque(maxlen=80)  # the current step's last lines, for error reports

    def close(self, status: str = "done") -> None:
        if self.current is not None:
            seconds = round(time.monotonic() - self.started, 1)
            self.stages[self.current] = seconds
            if self.current in BUILDER_STAGES:
                self.rep.event("stage", stage=self.current, status=status, s=seconds)
        self.current = None

    def error_lines(self) -> list[str]:
        """The current step's lines that look like errors (else its last lines), shortened."""
        lines = [ln.strip()[:300] for ln in self.tail if ln.strip()]
        return ([ln for ln in lines if ERROR_HINT.search(ln)] or lines)[-12:]

    def __call__(self, line: str) -> None:
        title = line.strip()
        key = "Starting container image" if title.startswith("Starting container image ") else title
        if key not in STEPS:
            self.tail.append(line)
            return
        self.tail.clear()
        stage = STEPS[key]
        if stage is not None and stage == self.current:
            return
        self.close()
        if stage is not None:
            self.current, self.started = stage, time.monotonic()
            if stage in BUILDER_STAGES:
                self.rep.event("stage", stage=stage, status="start")


class CibuildwheelBackend:
    """Runs cibuildwheel per cell on a tree attnforge prepared, in a locally built manylinux-like image."""

    name = "cibuildwheel"

    def __init__(self, project: Project, docker: str = DOCKER) -> None:
        self.project = project
        self.docker = docker
        self.builder = DockerBackend(project, docker)  # the base image, pip options and CA handling
        self.pip = self.builder.pip
        self.pip_args = self.pip.args
        self.cache = project.path(project.matrix.build.cache_dir)
        self.logs = project.path(project.matrix.build.output_dir) / "logs"
        self.manylinux = ManylinuxImages(self.builder, self.logs)  # the image cibuildwheel runs in
        self.images: dict[str, str] = {}
        self.toolchains: dict[str, dict[str, str | None]] = {}
        self.command: list[str] | None = None
        self.version: str | None = None
        self._procs: dict[str, subprocess.Popen[str]] = {}

    # ---- identity and images ----
    def _locate(self) -> tuple[list[str], str]:
        if self.command is None or self.version is None:
            self.command, self.version = find_cibuildwheel(self.cache / "tools")
        return self.command, self.version

    def identity(self) -> str:
        try:
            version = self._locate()[1]
        except EnvironmentProblem:
            version = "missing"  # prepare() says so, naming the cells
        digest = hashlib.sha256()
        for name in ("cuda-builder.Dockerfile", DOCKERFILE):
            with contextlib.suppress(OSError, EnvironmentProblem):
                digest.update((dockerfile_dir() / name).read_bytes())
        return json.dumps(
            {"backend": "cibuildwheel", "cibuildwheel": version, "dockerfiles": digest.hexdigest()[:16]},
            sort_keys=True,
        )

    def prepare(self, cells: list[Cell], view: ProgressView) -> None:
        ids = ", ".join(c.id for c in cells)
        for cell in cells:
            if cell.toolkit.kind != "cuda" or cell.platform != "x86_64":
                raise BuildError(f"{cell.id}: the cibuildwheel backend builds x86_64 CUDA cells only")
        try:
            command, version = self._locate()
        except EnvironmentProblem as exc:
            raise EnvironmentProblem(f"{ids}: {exc.message}", hint=exc.hint) from None
        view.log(f"cibuildwheel {version} ({' '.join(command)})")
        for toolkit in sorted({c.toolkit for c in cells}, key=str):
            members = [c for c in cells if c.toolkit == toolkit]
            pythons = sorted({c.python for c in members})
            tag = self.manylinux.ensure_image(toolkit, pythons, members, view)
            self.images[str(toolkit)] = tag
            for py in pythons:
                self.toolchains[f"{tag}|{py}"] = self.manylinux.image_toolchain(tag, py)

    # ---- one cell ----
    def _paths(self, job: CellJob) -> dict[str, Path]:
        root = job.workdir / "cibuildwheel"
        return {
            "root": root,
            "tree": root / "tree",
            "config": root / "cibuildwheel.toml",
            "wheelhouse": job.workdir / "out" / "wheelhouse",
            "result": job.workdir / "out" / "result.json",
        }

    def job_label(self, job: CellJob) -> str:
        """A `docker create` label naming this job's container: the cell in this cache (Ctrl-C removes it)."""
        return "attnforge.job=" + hashlib.sha256(str(job.workdir).encode()).hexdigest()[:16]

    def memory_bytes(self, job: CellJob) -> int:
        """The container's hard memory limit (no swap), as the docker backend computes it."""
        if job.memory_limit_gb is not None:
            limit_gb = job.memory_limit_gb
        else:
            limit_gb = job.parallelism.job_memory_gb * job.spec.max_jobs + 2.0
            if job.parallelism.fits:
                limit_gb = min(limit_gb, detect_machine().memory_available_gb)
        return int(limit_gb * GIB)

    def create_args(self, job: CellJob) -> list[str]:
        """`docker create` flags: host network, memory cap, mirrors and CA read-only, the ccache folder."""
        memory = self.memory_bytes(job)
        args = [
            "--network=host",
            f"--memory={memory}",
            f"--memory-swap={memory}",
            f"--label={self.job_label(job)}",
        ]
        args += [f"--volume={p}:{p}:ro" for p in self.pip.local_paths if p.exists()]
        if self.builder.ca_bundle:
            args.append(f"--volume={self.builder.ca_bundle}:{CA_IN_CONTAINER}:ro")
        if job.spec.ccache_dir:  # at its own path: the container is thrown away, the cache is not
            args.append(f"--volume={job.spec.ccache_dir}:{job.spec.ccache_dir}")
        return args

    def pip_env(self) -> dict[str, str]:
        env = {
            "PIP_CONFIG_FILE": "/dev/null",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            **pip_env_from_args(self.pip_args),
        }
        if self.builder.ca_bundle:
            env |= {k: CA_IN_CONTAINER for k in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")}
        return env

    @staticmethod
    def knobs(spec: dict[str, Any], tree: Path, sdist: Path, cuda_home: str) -> dict[str, str]:
        """The compile environment incontainer.py would set for this spec (flash-attn's knobs, the hook's).

        ccache as the docker backend uses it, but seen from the container: base dir /project, and torch
        >= 2.14 wraps nvcc and c++ by itself (older torch: PYTORCH_NVCC). It is what lets an OOM retry or
        a `--force` rebuild skip finished units: every cibuildwheel run starts in a fresh container.
        """
        env = incontainer.build_env(
            {**spec, "ccache": None}, "/x/bin/python", tree, sdist, int(spec["max_jobs"]), None
        )
        keys = [*KNOBS, *(spec.get("env") or {})]
        out = {k: env[k] for k in keys if k in env}
        cc = spec.get("ccache")
        if cc and cc.get("dir") and not (spec.get("env") or {}).get("TORCH_NO_COMPILER_WRAPPER"):
            out.pop("TORCH_NO_COMPILER_WRAPPER", None)
            out |= {
                "CCACHE_DIR": str(cc["dir"]),
                "CCACHE_MAXSIZE": str(cc.get("max_size", "20G")),
                "CCACHE_BASEDIR": CONTAINER_PROJECT,
                "CCACHE_NOHASHDIR": "true",
                "CCACHE_COMPILERCHECK": "content",
            }
            if Version(str(spec["torch"])).release[:2] < AUTO_CCACHE_TORCH.release:
                out["PYTORCH_NVCC"] = f"ccache {cuda_home}/bin/nvcc"
        return out

    def config(self, job: CellJob, spec: dict[str, Any], tree: Path, sdist: Path) -> dict[str, Any]:
        return cibuildwheel_config(
            job.cell,
            image=self.images.get(str(job.cell.toolkit), IMAGE_REPO),
            max_jobs=job.spec.max_jobs,
            nvcc_threads=job.spec.nvcc_threads,
            create_args=self.create_args(job),
            pip_env=self.pip_env(),
            env=self.knobs(spec, tree, sdist, f"/usr/local/cuda-{job.cell.toolkit.version}"),
            prepared=True,
            disable_host_mount=True,
        )

    def command_line(self, job: CellJob) -> list[str]:
        """The cibuildwheel command (run in the prepared tree)."""
        paths = self._paths(job)
        command = self.command or ["cibuildwheel"]
        return [*command, "--platform", "linux", "--config-file", str(paths["config"])] + [
            "--output-dir",
            str(paths["wheelhouse"]),
            ".",
        ]

    def run(self, job: CellJob, on_line: Callable[[str], None]) -> int:
        rep = _Relay(on_line)
        paths = self._paths(job)
        result: dict[str, Any] = {
            "schema": 1,
            "ok": False,
            "cell_id": job.cell.id,
            "stages": {},
            "error": None,
        }
        start = time.monotonic()
        paths["result"].parent.mkdir(parents=True, exist_ok=True)
        paths["result"].unlink(missing_ok=True)
        try:
            code = self._run(job, rep, paths, result)
        except incontainer.BuildFailure as exc:
            code = exc.code
            result["error"] = {"message": exc.message, **exc.details}
            rep.line(f"attnforge: error: {exc.message}")
        result["exit_code"] = code
        result["ok"] = code == 0
        result["wall_s"] = round(time.monotonic() - start, 1)
        paths["result"].write_text(json.dumps(result, indent=1))
        return code

    def _run(
        self, job: CellJob, rep: incontainer.Reporter, paths: dict[str, Path], result: dict[str, Any]
    ) -> int:
        spec = incontainer.load_spec(job.workdir / "spec.json")
        spec["build_dir"] = str(paths["tree"])  # not the docker backend's tree: no foreign build/ folder
        with incontainer.Stage(rep, result["stages"], "source"):
            sdist = incontainer.fetch_source(spec, rep)
        patches = incontainer.resolve_patches(spec)
        result["patches_applied"] = patches
        with incontainer.Stage(rep, result["stages"], "unpack"):
            tree = incontainer.prepare_tree(spec, sdist, patches, rep)
        if job.spec.ccache_dir:
            Path(job.spec.ccache_dir).mkdir(parents=True, exist_ok=True)
        config = self.config(job, spec, tree, sdist)
        paths["config"].write_text(to_toml(config, job.cell, prepared=True))
        subprocess.run(["rm", "-rf", str(paths["wheelhouse"])], check=False)
        cmd = self.command_line(job)
        rep.line("attnforge: " + " ".join(cmd) + f"  (in {tree})")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
        env |= {
            "PATH": f"{Path(self.docker).parent}:{env.get('PATH', '')}",  # the engine's own docker CLI first
            "SOURCE_DATE_EPOCH": str(spec["source_date_epoch"] or incontainer.sdist_epoch(sdist)),
            "CIBW_LOG_FOLD_MODE": "disabled",
            "PYTHONUNBUFFERED": "1",
        }
        parser = incontainer.NinjaParser(rep)
        steps = StepTracker(rep)
        imported: list[str] = []
        proc = subprocess.Popen(
            cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", bufsize=1,  # same process group: Ctrl-C reaches cibuildwheel, like `docker run`
        )  # fmt: skip
        self._procs[job.cell.id] = proc
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                rep.line(line)
                steps(line)
                parser(line)
                if line.strip().startswith(IMPORT_MARKER):
                    imported.append(line.strip())
            rc = proc.wait()
        finally:
            self._procs.pop(job.cell.id, None)
        failed_stage = steps.current
        steps.close("done" if rc == 0 else "failed")
        result["stages"].update(steps.stages)
        self._record_units(result, parser, rc)
        tag = self.images.get(str(job.cell.toolkit), "")
        result |= {
            "image": tag,
            "cibuildwheel": self.version,
            "max_jobs": job.spec.max_jobs,
            "nvcc_threads": job.spec.nvcc_threads,
            "toolchain": {**self.toolchains.get(f"{tag}|{job.cell.python}", {}), "torch": _torch(imported)},
            "peak_rss_gb": None,  # measured inside the container by nobody: cibuildwheel has no hook for it
        }
        if rc != 0:
            return self._failure(rc, failed_stage, parser, result, steps.error_lines())
        wheels = sorted(paths["wheelhouse"].glob("*.whl"))
        if len(wheels) != 1:
            raise incontainer.BuildFailure(
                EXIT_COMPILE_ERROR,
                f"expected one wheel in {paths['wheelhouse']}, found {[w.name for w in wheels]}",
            )
        wheel = wheels[0]
        result |= {
            "wheel": str(wheel),
            "wheel_name": wheel.name,
            "size": wheel.stat().st_size,
            "sha256": incontainer.sha256_file(wheel),
            "import_check": {
                "ok": bool(imported),
                "output": "\n".join(imported),
                "modules": ["flash_attn_2_cuda"],
            },
        }
        return 0

    @staticmethod
    def _record_units(result: dict[str, Any], parser: incontainer.NinjaParser, rc: int) -> None:
        total = parser.units_total
        compiled = len(parser.finished)
        result["units_total"] = total
        result["units_compiled"] = compiled
        result["units_reused"] = (total - compiled) if total is not None and rc == 0 else None
        result["units_prebuilt"] = 0

    @staticmethod
    def _failure(
        rc: int, stage: str | None, parser: incontainer.NinjaParser, result: dict[str, Any], lines: list[str]
    ) -> int:
        """Map a failed cibuildwheel run to the builder's exit codes, with the builder's error record."""
        if parser.failures:
            kind, details = parser.failure_summary()
            if kind == "oom":
                result["error"] = {
                    "message": f"a compiler was killed (OOM) in {details.get('unit')}",
                    "kind": "oom",
                    **details,
                }
                return EXIT_OOM
            result["error"] = {
                "message": f"compile error in unit {details['unit']}",
                "kind": "compile",
                **details,
            }
            return EXIT_COMPILE_ERROR
        where = {
            "container": ("cibuildwheel could not start or fill its container", EXIT_ENVIRONMENT),
            "toolkit": ("before-all (toolkit check) failed", EXIT_ENVIRONMENT),
            "venv": ("before-build could not install torch and the build requirements", EXIT_ENVIRONMENT),
            "compile": ("the wheel build failed", EXIT_COMPILE_ERROR),
            "repair": ("auditwheel repair failed", EXIT_COMPILE_ERROR),
            "import_check": ("the wheel does not import in cibuildwheel's test venv", EXIT_IMPORT),
        }
        message, code = where.get(stage or "", (f"cibuildwheel exited {rc}", EXIT_COMPILE_ERROR))
        if stage is None and rc == 2:
            message, code = "cibuildwheel rejected the generated config", EXIT_BAD_SPEC
        elif stage is None and rc == 7:
            message, code = "the Docker engine is too old for cibuildwheel (API >= 1.41)", EXIT_ENVIRONMENT
        result["error"] = {
            "message": f"{message} (cibuildwheel exit {rc})",
            "kind": stage or "cibuildwheel",
            "lines": [*parser.other_errors[-8:], *lines],
        }
        return code

    def cancel(self, job: CellJob) -> None:
        proc = self._procs.get(job.cell.id)
        if proc and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGINT)  # cibuildwheel removes its container on KeyboardInterrupt
        ids = subprocess.run(
            [self.docker, "ps", "-q", "--filter", f"label={self.job_label(job)}"],
            capture_output=True, text=True, check=False,
        ).stdout.split()  # fmt: skip
        if ids:
            subprocess.run([self.docker, "rm", "-f", *ids], capture_output=True, check=False)


def _torch(imported: list[str]) -> str | None:
    """torch's version from the import check's line (`attnforge-import-check <flash-attn> <torch>`)."""
    parts = imported[-1].split() if imported else []
    return parts[2] if len(parts) >= 3 else None
