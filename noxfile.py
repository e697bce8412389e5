"""attnforge's sessions. `nox -l` lists them; each docstring says what it does.

Arguments after `--` go to the command a session runs, e.g. `nox -s build-wheels -- --target release`.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]  # it lints first

PYTHON = "3.11"
# The slow real builds CI runs (test id substrings); ATTNFORGE_RUN_ALL_SLOW=1 runs every slow test.
# Left out of CI (2 cores, 90 min), each recorded instead: the default flash-attn build through Docker
# (test_build_default, ~10 min: benchmarks/results/build_default.json), the images end-to-end build
# (test_images_build, ~10 min) and the two-Python reuse build (benchmarks/results/matrix_cost.json).
CI_SLOW_ALLOWLIST: list[str] = [
    "test_flex_cpu_wheel",  # Flex kernels built on CPU, packaged, loaded in a fresh venv (~4 min)
    "test_flex_precompiled",  # a precompiled Flex function loaded without tracing; guards; corruption (~1.5 min)
    "test_rocm_triton_wheel",  # ROCm Triton-profile wheel from the real sdist (~2 min)
    "test_rocm_triton_build",  # `attnforge build --cell <ROCm Triton cell>`, install, import (~1.5-2 min)
]


def _install(session: nox.Session, extras: str = "") -> None:
    session.install("-e", f".{extras}")


@nox.session(name="build-wheels", python=PYTHON)
def build_wheels(session: nox.Session) -> None:
    """Build the wheels of a matrix target (default: `default`) into wheels/. Args go to `attnforge build`."""
    _install(session, "[publish]")  # finalize rewrites the wheel (wheel) and audits it (auditwheel)
    session.run("attnforge", "build", *(session.posargs or ["--target", "default"]))


@nox.session(python=PYTHON)
def plan(session: nox.Session) -> None:
    """Print the cells of a target with validity and reasons. Args go to `attnforge plan`."""
    _install(session)
    session.run("attnforge", "plan", *(session.posargs or ["--target", "default"]))


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Lint (as `lint`, fails fast), then the tests: unit + integration with real Docker, pip, index servers."""
    _install(session, "[dev]")
    _lint(session)
    session.install("torch==2.13.0+cpu")  # CPU torch for the reference, tolerance and Flex-on-CPU tests
    args = session.posargs or ["-m", "not gpu", "-p", "no:cacheprovider", "tests"]
    env = {"ATTNFORGE_SLOW_ALLOW": ",".join(CI_SLOW_ALLOWLIST), **_ci_env()}
    session.run("pytest", *args, env=env)


@nox.session(name="runner-check", venv_backend="none")
def runner_check(session: nox.Session) -> None:
    """Validate this machine as a self-hosted GPU runner (driver, arches, Docker, disk, MAX_JOBS, smoke run)."""
    args = session.posargs or ["--target", "default", "--json", "reports/gpu/runner_check.json"]
    session.run("attnforge", "runner", "check", *args, external=True)


@nox.session(name="gpu-parity", venv_backend="none")
def gpu_parity(session: nox.Session) -> None:
    """GPU parity of each wheel in a folder (`-- --wheels wheels`) over this machine's torch; records it in the manifests."""
    args = list(session.posargs)
    if args[:1] != ["--wheels"]:
        session.run("attnforge", "parity", "run", *args, external=True)
        return
    if len(args) < 2:
        session.error("--wheels needs a folder")
    wheels = sorted(Path(args[1]).glob("flash_attn-*.whl"))
    if not wheels:
        session.error(f"no flash_attn wheels in {args[1]}")
    for wheel in wheels:
        session.run("attnforge", "parity", "run", "--wheel", str(wheel), *args[2:], external=True)


@nox.session(python=PYTHON)
def ci(session: nox.Session) -> None:
    """Regenerate .github/workflows from matrix.yaml (`-- --check` fails when the checked-in files differ)."""
    _install(session, "[dev]")
    session.run("attnforge", "ci", "generate", *session.posargs)


@nox.session(python=PYTHON)
def publish(session: nox.Session) -> None:
    """Publish the built wheels: `-- --to local` (static per-variant index) or `-- --to internal` (pypiserver)."""
    _install(session, "[publish]")
    session.run("attnforge", "publish", *(session.posargs or ["--to", "local"]))


@nox.session(python=PYTHON)
def images(session: nox.Session) -> None:
    """Build runtime/NGC images of a target's wheels, smoke-test them, and push with `-- --push HOST:PORT`."""
    _install(session)
    session.run("attnforge", "images", "build", *(session.posargs or ["--target", "default"]))


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint + format check) and mypy --strict on src/ (the `tests` session runs them first too)."""
    _install(session, "[dev]")
    _lint(session)


def _lint(session: nox.Session) -> None:
    session.run("ruff", "check", "src", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "noxfile.py")
    session.run("mypy")


def _ci_env() -> dict[str, str]:
    return {"CI": os.environ["CI"]} if "CI" in os.environ else {}
