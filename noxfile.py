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
# CI has 2 cores, 24 GiB and 90 minutes for `.ci/run`; the suite must stay well under that (goal: 45 min).
# In CI: the README's main job itself (so a change that breaks it cannot land), the image path end to end
# (runtime + NGC-style images, registry push, `attnforge pull` back) and the Flex wheels. Not slow-marked, so
# always run: the Philox header checks against every torch release the matrix names (~30 s, headers cached
# per user). Left out, each recorded instead: the long images test (test_images_build: two CUDA variants,
# secrets in layers, keep policy), the multi-torch/Python lane builds (benchmarks/results/matrix_cost.json) and
# tests/integration/test_build_cu124.py (the CUDA 12.4 lane on the local stand-in base: ~30 min of compile on
# 2 cores plus two ~5 GB torch 2.6 venvs, more than the budget left); they run by hand
# (`ATTNFORGE_RUN_ALL_SLOW=1 pytest tests/integration/test_images_build.py tests/integration/test_build_cu124.py`).
# Also left out: tests/integration/test_build_aarch64.py (an aarch64 cell cross-compiled on x86-64: all 5 units
# again, their host stubs being aarch64 code, plus two torch downloads: 10-15 min on 2 cores, over the 2 minutes
# an aarch64 compile may take in CI). The 3.14/3.14t and aarch64 plan, rule and workflow tests are unit tests
# (seconds: tests/unit/test_py314_aarch64_plan.py).
CI_SLOW_ALLOWLIST: list[str] = [
    "test_build_default",  # `attnforge build --target default` through Docker + the env build against its torch (~7 min)
    "test_installed_wheel",  # attnforge's own wheel in a fresh venv: plan, --dry-run, builder image (~2 min)
    "test_images_fast",  # runtime + NGC-style images built, smoked, pushed, pulled back, smoked (~4 min warm)
    "test_flex_cpu_wheel",  # Flex kernels built on CPU, packaged, loaded in a fresh venv (~4 min); also selects
    # test_flex_cpu_wheel_clients: declared transformers/diffusers shapes served from the wheel (~5 min)
    "test_flex_precompiled",  # a precompiled Flex function loaded without tracing; guards; corruption (~1.5 min)
    "test_rocm_triton_build",  # `attnforge build --cell <ROCm Triton cell>`, install, import (~2 min)
    "test_index_page_browser",  # the index page in headless Chromium over `attnforge serve` (~50 s, two indexes)
    "test_pip_secrets",  # a private index's password reaches pip in the builder and no log, spec or ps (~45 s)
    "test_user_repo_ci",  # a user's repo runs its generated CI's CPU jobs; the build reuses test_build_default's cache (~1.5 min)
]


# What the drift session runs besides the unit tests: the client tests whose upstream moves most, and the
# reproductions of upstream problems (marked `drift`, left out of `tests`).
DRIFT_TESTS = ["tests/integration/test_flex_cpu_wheel_clients.py", "tests/drift"]
LOCK = Path("pylock.toml")  # the test environment, pinned with hashes (`nox -s lock` refreshes it)
PIP = "pip==26.3"  # the first pip that installs from a pylock.toml (`pip install -r pylock.toml`)


def _install(session: nox.Session, extras: str = "") -> None:
    session.install("-e", f".{extras}")


def _install_locked(session: nox.Session) -> None:
    """The locked lint/test environment (exact versions and hashes from pylock.toml), then attnforge itself."""
    session.install(PIP)
    session.install("-r", str(LOCK))
    session.install("--no-deps", "-e", ".")
    session.run("python", "-m", "pip", "list", "--format", "freeze", silent=False)


@nox.session(name="build-wheels", python=PYTHON)
def build_wheels(session: nox.Session) -> None:
    """Build the wheels of a matrix target (default: `default`) into wheels/. Args go to `attnforge build`."""
    _install(
        session, "[build]"
    )  # finalize rewrites the wheel (wheel) and audits it (auditwheel); no publish tools
    session.run("attnforge", "build", *(session.posargs or ["--target", "default"]))


@nox.session(python=PYTHON)
def plan(session: nox.Session) -> None:
    """Print the cells of a target with validity and reasons. Args go to `attnforge plan`."""
    _install(session)
    session.run("attnforge", "plan", *(session.posargs or ["--target", "default"]))


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Lint (as `lint`, fails fast), then the tests: unit + integration with real Docker, pip, index servers."""
    _install_locked(session)  # includes the CPU torch for the reference, tolerance and Flex-on-CPU tests
    _lint(session)
    args = session.posargs or [
        "-m",
        "not gpu and not drift",
        "-p",
        "no:cacheprovider",
        "--durations=30",
        "tests",
    ]
    env = {"ATTNFORGE_SLOW_ALLOW": ",".join(CI_SLOW_ALLOWLIST), **_ci_env()}
    session.run("pytest", *args, env=env)


@nox.session(python=PYTHON)
def lock(session: nox.Session) -> None:
    """Refresh pylock.toml: resolve attnforge's dependencies, its `dev` extra and the CPU torch to exact versions
    with hashes (through this machine's pip configuration and cache), for the tests and lint sessions."""
    import tomllib

    session.install(PIP)
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"], _cpu_torch()]
    requirements = Path(session.create_tmp()) / "lock-input.txt"
    requirements.write_text("\n".join(wanted) + "\n")
    session.run("python", "-m", "pip", "lock", "-q", "-r", str(requirements), "-o", str(LOCK))
    session.log(f"wrote {LOCK}; `nox -s tests` installs exactly these versions")


@nox.session(python=PYTHON)
def drift(session: nox.Session) -> None:
    """The suite against the newest releases of the test dependencies (not the lock), and the `drift` tests:
    reproductions of upstream problems. Reports which versions moved; CI does not run it, so drift never
    blocks a landing. Args go to pytest (default: unit tests, the Flex client tests and every `drift` test)."""
    import json

    import tomllib
    from packaging.utils import canonicalize_name

    _install(session, "[dev]")
    session.install(_cpu_torch())
    locked = {p["name"]: p.get("version") for p in tomllib.loads(LOCK.read_text())["packages"]}
    newest = json.loads(str(session.run("python", "-m", "pip", "list", "--format", "json", silent=True)))
    moved = [
        f"{p['name']} {locked[name]} -> {p['version']}"
        for p in newest
        if (name := canonicalize_name(p["name"])) in locked and locked[name] != p["version"]
    ]
    session.log("moved since pylock.toml: " + (", ".join(moved) or "nothing"))
    # the shipped compat data against the live package index: exit 1 (and the findings) when upstream moved
    session.run("attnforge", "compat", "refresh", "--check")
    args = session.posargs or ["-m", "drift or not gpu", "-p", "no:cacheprovider", "tests/unit", *DRIFT_TESTS]
    env = {"ATTNFORGE_SLOW_ALLOW": "test_flex_cpu_wheel_clients", **_ci_env()}
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


@nox.session(name="gpu-validate", venv_backend="none")
def gpu_validate(session: nox.Session) -> None:
    """On a GPU machine, with its own torch: build (`attnforge build --python`), parity, publish, install.

    `attnforge build --python $(command -v python3)` (args after `--` go to it; default `--profile
    hd64128`), `attnforge parity run` on the wheel (a signed parity record beside it), `attnforge publish --to gpu`
    (a static index that takes only wheels whose parity passed), then `attnforge serve` that index while
    `attnforge runner check --smoke-index` installs the wheel from it into a fresh venv and runs it. Every
    step runs; the session fails when one did. Writes reports/gpu/env_build.json ($ATTNFORGE_GPU_REPORT);
    $ATTNFORGE_PARITY_ARGS adds arguments to the parity run (e.g. `--suites flash,hf`).
    """
    import json
    import shutil
    import subprocess
    import sys
    import time

    def step(*cmd: str) -> int:
        session.log(" ".join(cmd))
        return subprocess.run(cmd, check=False).returncode

    python = shutil.which("python3") or sys.executable
    build_args = session.posargs or ["--profile", "hd64128"]
    out = Path(os.environ.get("ATTNFORGE_GPU_REPORT", "reports/gpu/env_build.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    before = {p: p.stat().st_mtime for p in Path("wheels").glob("*.whl")}
    if step("attnforge", "build", "--python", python, "--quiet", *build_args) != 0:
        session.error("the build failed (log in wheels/logs/)")
    wall = round(time.monotonic() - start, 1)
    fresh = [p for p in Path("wheels").glob("*.whl") if before.get(p) != p.stat().st_mtime]
    wheel = max(fresh or Path("wheels").glob("*.whl"), key=lambda p: p.stat().st_mtime)
    parity_dir = out.parent / "env-parity"
    parity_args = os.environ.get("ATTNFORGE_PARITY_ARGS", "").split()  # e.g. "--suites flash,hf"
    codes = {
        "parity": step(
            "attnforge", "parity", "run", "--wheel", str(wheel), "--out", str(parity_dir), *parity_args
        )
    }
    codes["publish"] = step("attnforge", "publish", "--to", "gpu", str(wheel))
    manifest = json.loads(Path(f"{wheel}.manifest.json").read_text())
    serve = subprocess.Popen(
        ["attnforge", "serve", "wheels/gpu-index", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    check = out.parent / "env_runner_check.json"
    try:
        url = (serve.stdout.readline() if serve.stdout else "").split(" at ")[-1].strip().rstrip("/")
        codes["smoke"] = step(
            "attnforge",
            "runner",
            "check",
            "--no-cxx-probe",
            "--json",
            str(check),
            "--smoke-index",
            f"{url}/{manifest['variant']}/simple",
        )
    finally:
        serve.terminate()
    parity = (
        json.loads((parity_dir / "parity.json").read_text()) if (parity_dir / "parity.json").is_file() else {}
    )
    smoke = json.loads(check.read_text()).get("smoke", {}) if check.is_file() else {}
    report = {
        "device": parity.get("device"),
        "command": f"nox -s gpu-validate -- {' '.join(build_args)}",
        "wheel": wheel.name,
        "backend": manifest["build"]["backend"],
        "torch_build": manifest["build"].get("torch_build"),
        "wall_s": wall,
        "parity": {"passed": parity.get("passed"), "failed": parity.get("failed")},
        "published": codes["publish"] == 0,
        "smoke_ok": codes["smoke"] == 0 and smoke.get("passed", 0) > 0 and smoke.get("failed") == 0,
        "exit_codes": codes,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    session.log(json.dumps(report))
    if any(codes.values()):
        session.error(f"a step failed: {codes}")


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
    session.run("ruff", "check", "src", "tests", "benchmarks", "scripts", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "scripts", "noxfile.py")
    session.run("lint-imports")  # the layer contracts in pyproject.toml [tool.importlinter]
    # mypy follows the locked torch's own types; its cache lives outside the checkout so a fresh clone on the
    # same machine rechecks only what changed (about 2 min of CPU cold, seconds warm)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attnforge" / "mypy"
    session.run("mypy", "--cache-dir", str(cache))


def _cpu_torch() -> str:
    """The CPU stand-in torch of src/attnforge/data/pins.toml (one spelling for the package and the tests)."""
    import tomllib

    return str(tomllib.loads(Path("src/attnforge/data/pins.toml").read_text())["cpu_torch"])


def _ci_env() -> dict[str, str]:
    return {"CI": os.environ["CI"]} if "CI" in os.environ else {}
