"""Real wheels and real environments for the wheel/index/publish integration tests (no mocks).

- Two torch environments (venvs): torch 2.14.1 (CUDA 13.0 build, through pip) and torch
  2.13.0+cpu (through pip and its configuration). Each is created once per session, or once ever when
  $ATTNFORGE_TEST_CACHE names a folder to keep them in (a torch 2.14.1 venv is ~5 GB, ~70 s).
- `data/mini_flash_attn`, a flash_attn-shaped package with a compiled torch extension
  `flash_attn_2_cuda`, built with `pip wheel --no-build-isolation` in each: against torch 2.14.1 a CUDA
  extension (nvcc 13.0 from /usr/local/cuda, sm_90), against torch 2.13.0+cpu a C++ extension.
- Each raw wheel gets a build-engine-style manifest and goes through `attnforge wheels finalize`.
- "Fresh" install environments are venvs without pip whose site-packages see a torch venv through
  a .pth file: pip (run from the dev venv with `--python`) sees that torch as installed, so an install
  resolves against it exactly as it would in a full copy, in a second instead of a minute.

Fixtures are session-scoped; the work behind them is memoized on disk, so modules importing them share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from attnforge.wheels.records import PROVENANCE_SUFFIX, record_path

DATA = Path(__file__).parent / "data" / "mini_flash_attn"
CUDA_HOME = Path("/usr/local/cuda")
VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class TorchSpec:
    """One torch the fixtures build against."""

    key: str  # "2.14" | "2.13"
    requirement: str
    toolkit: str
    torch: str
    torch_variant: str
    local_version_at_build: str | None  # what the "build" sets via FLASH_ATTN_LOCAL_VERSION


SPECS = {
    # the real thing: CUDA 13.0 torch; the build leaves the local version to finalize
    "2.14": TorchSpec("2.14", "torch==2.14.1", "cuda13.0", "2.14.1", "cu130", None),
    # torch+cpu: a C++ extension (labelled cuda13.0 like its cell; only the mismatch tests use it),
    # built with FLASH_ATTN_LOCAL_VERSION already set, as upstream's setup.py does
    "2.13": TorchSpec("2.13", "torch==2.13.0+cpu", "cuda13.0", "2.13.0", "cpu", "cu130torch2.13cxx11abiTRUE"),
}


@dataclass(frozen=True)
class TorchEnv:
    """A venv with one torch."""

    spec: TorchSpec
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return next((self.root / "lib").glob("python3*/site-packages"))


def run(cmd: list[str | Path], *, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run with text output captured; on failure the output is in the assertion message."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{cmd} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """$ATTNFORGE_TEST_CACHE (kept across sessions) or this session's temp folder."""
    env = os.environ.get("ATTNFORGE_TEST_CACHE")
    root = Path(env) if env else tmp_path_factory.getbasetemp() / "wheelfactory"
    root.mkdir(parents=True, exist_ok=True)
    return root


def torch_env(root: Path, key: str) -> TorchEnv:
    """The venv for SPECS[key], created on first use (pip with this machine's config: the local mirror)."""
    spec = SPECS[key]
    env = TorchEnv(spec, root / f"venv-torch{key}")
    ready = env.root / ".ready"
    with _locked(root / f".venv-torch{key}.lock"):
        if ready.is_file() and ready.read_text() == spec.requirement:
            return env
        shutil.rmtree(env.root, ignore_errors=True)
        venv.create(env.root, with_pip=True, symlinks=True)
        run(
            [
                env.python,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-compile",  # byte-compiling all of torch: CPU the tests don't need (imports cache it)
                spec.requirement,
                "setuptools",
                "wheel",
            ]
        )
        ready.write_text(spec.requirement)
    return env


def raw_manifest(spec: TorchSpec, wheel_name: str) -> dict[str, Any]:
    """What the build engine writes beside a freshly built wheel (docs/contracts.md)."""
    cell_id = f"flash-attn-2.8.3-cu130-torch{spec.torch}-cp311-abi1-sm90-full-x86_64"
    return {
        "schema": 1,
        "cell_id": cell_id,
        "variant": f"cu130-torch{spec.key}",
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "wheel": wheel_name,
        "sha256": None,
        "size": None,
        "inputs": {
            "source": "path",
            "source_sha256": None,
            "toolkit": spec.toolkit,
            "torch": spec.torch,
            "torch_variant": spec.torch_variant,
            "python": "3.11",
            "cxx11_abi": True,
            "arches": ["sm_90"],
            "profile": "full",
            "profile_flags": [],
            "head_dims": None,
            "patches": [],
        },
        "kernel_set_key": "0" * 16,
        "input_hash": "0" * 16,
        "toolchain": {
            "nvcc": "13.0",
            "gcc": "12.2.0",
            "python": "3.11",
            "torch": spec.requirement.split("==")[1],
        },
        "build": {"backend": "local", "wall_s": 0.0},
        "platform_tag": None,
        "parity": None,
    }


def build_raw_wheel(env: TorchEnv, out: Path) -> Path:
    """`pip wheel --no-build-isolation` of mini_flash_attn against the env's torch."""
    src = out / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(DATA, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    build_env = dict(os.environ, MAX_JOBS="2", FLASH_ATTN_CUDA_ARCHS="90")
    if CUDA_HOME.is_dir():
        build_env["CUDA_HOME"] = str(CUDA_HOME)
        build_env["PATH"] = f"{CUDA_HOME / 'bin'}:{build_env['PATH']}"
    if env.spec.local_version_at_build:
        build_env["FLASH_ATTN_LOCAL_VERSION"] = env.spec.local_version_at_build
    raw = out / "raw"
    run(
        [env.python, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", raw, src],
        env=build_env,
    )
    wheels = sorted(raw.glob("flash_attn-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def cli(*args: str | Path, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    """The real `attnforge` command line of the dev venv."""
    exe = VENV_BIN / "attnforge"
    cmd: list[str | Path] = [exe] if exe.exists() else [sys.executable, "-m", "attnforge.cli"]
    return run([*cmd, *args], check=check, **kw)


def finalized_wheel(root: Path, key: str) -> Path:
    """Build (once) and finalize (once) the wheel for SPECS[key]; returns the finalized file."""
    out = root / f"wheel-torch{key}"
    ready = out / ".ready"
    with _locked(root / f".wheel-torch{key}.lock"):
        final = out / "final" / ready.read_text() if ready.is_file() else None
        if final is not None and final.is_file() and record_path(final, PROVENANCE_SUFFIX).is_file():
            return final
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        env = torch_env(root, key)
        raw = build_raw_wheel(env, out)
        shutil.copy2(raw, out / "raw-original.whl")
        manifest = raw.with_name(raw.name + ".manifest.json")
        manifest.write_text(json.dumps(raw_manifest(env.spec, raw.name), indent=2))
        final_dir = out / "final"
        proc = cli(
            "wheels",
            "finalize",
            raw,
            "--out-dir",
            final_dir,
            env=dict(os.environ, SOURCE_DATE_EPOCH="1700000000"),
        )
        final = Path(proc.stdout.strip().splitlines()[-1])
        assert final.is_file(), proc
        ready.write_text(final.name)
        return final


def copy_wheel(wheel: Path, dest: Path) -> Path:
    """Copy a finalized wheel, its manifest and its signed records (docs/records.md) into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(wheel, dest / wheel.name)
    for extra in sorted(wheel.parent.glob(glob.escape(wheel.name) + ".*")):
        shutil.copy2(extra, dest / extra.name)
    return dest / wheel.name


def fresh_env(path: Path, base: TorchEnv) -> Path:
    """A new venv without pip whose site-packages see `base`'s torch; returns its python."""
    venv.create(path, with_pip=False, symlinks=True)
    site = next((path / "lib").glob("python3*/site-packages"))
    (site / "_torch_from_base.pth").write_text(str(base.site_packages) + "\n")
    return path / "bin" / "python"


def pip_install(python: Path, *args: str | Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    """pip (the dev venv's) installing into `python`'s env with no pip configuration at all.

    This machine's pip config adds a local mirror and constraints: none of it may leak into a test
    that shows what a user's pip does with our index alone.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-cache-dir",
            "--disable-pip-version-check",
            *args,
        ],
        check=check,
        env=env,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, timeout: float = 30.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Served:
    """A background process serving HTTP; stopped (and its log kept) on exit."""

    def __init__(
        self, cmd: list[str | Path], log: Path, url: str | None = None, pipe_stdout: bool = False
    ) -> None:
        self.log = log
        self._fh = log.open("w")
        stdout = subprocess.PIPE if pipe_stdout else self._fh
        self.proc = subprocess.Popen([str(c) for c in cmd], stdout=stdout, stderr=self._fh, text=True)
        self.url = url or ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._fh.close()

    def text(self) -> str:
        self._fh.flush()
        return self.log.read_text()


@contextlib.contextmanager
def attnforge_serve(directory: Path, log: Path) -> Iterator[Served]:
    """`attnforge serve --port 0 DIR`; the URL comes from its first line."""
    exe = VENV_BIN / "attnforge"
    served = Served([exe, "serve", "--port", "0", directory], log, pipe_stdout=True)
    try:
        assert served.proc.stdout is not None
        first = served.proc.stdout.readline()
        assert first.startswith("serving "), (first, served.text())
        served.url = first.rsplit(" ", 1)[-1].strip().rstrip("/")
        yield served
    finally:
        served.stop()


@contextlib.contextmanager
def pypiserver(root: Path, user: str, password: str, authenticate: str = "update") -> Iterator[Served]:
    """pypiserver on 127.0.0.1 with an htpasswd file (passlib); `authenticate`: the actions that need the
    password (uploads; "download,list,update" makes a private index)."""
    from passlib.apache import HtpasswdFile

    packages = root / "packages"
    packages.mkdir(parents=True, exist_ok=True)
    htpasswd = root / "htpasswd"
    ht = HtpasswdFile(str(htpasswd), new=True, default_scheme="apr_md5_crypt")
    ht.set_password(user, password)
    ht.save()
    port = free_port()
    cmd: list[str | Path] = [
        VENV_BIN / "pypi-server",
        "run",
        "-i",
        "127.0.0.1",
        "-p",
        str(port),
        "-P",
        htpasswd,
        "-a",
        authenticate,
        "--disable-fallback",
        "--hash-algo",
        "sha256",
        "--server",
        "wsgiref",
        packages,
    ]
    served = Served(cmd, root / "pypiserver.log", url=f"http://127.0.0.1:{port}")
    try:
        wait_for(served.url + "/simple/")
        yield served
    finally:
        served.stop()


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def factory_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = cache_root(tmp_path_factory)
    # the wheels' records are signed (and publish trusts them) with a key of the factory's own, never with the
    # local key in this user's ~/.config; kept with the wheels when $ATTNFORGE_TEST_CACHE keeps them
    key = root / "signing-key.pem"
    with _locked(root / ".signing-key.lock"):
        if not key.is_file():
            cli("keys", "generate", key)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFORGE_SIGNING_KEY", str(key))
        yield root
    if not os.environ.get("ATTNFORGE_TEST_CACHE"):
        shutil.rmtree(root, ignore_errors=True)  # ~6 GB of venvs: pytest would keep three sessions' worth


@pytest.fixture(scope="session")
def torch214(factory_root: Path) -> TorchEnv:
    return torch_env(factory_root, "2.14")


@pytest.fixture(scope="session")
def torch213(factory_root: Path) -> TorchEnv:
    return torch_env(factory_root, "2.13")


@pytest.fixture(scope="session")
def wheel214(factory_root: Path, torch214: TorchEnv) -> Path:
    return finalized_wheel(factory_root, "2.14")


@pytest.fixture(scope="session")
def wheel213(factory_root: Path, torch213: TorchEnv) -> Path:
    return finalized_wheel(factory_root, "2.13")


def write_matrix(project: Path, **destinations: dict[str, Any]) -> Path:
    """A minimal matrix.yaml whose `destinations:` are the given ones."""
    import yaml

    matrix = {
        "version": 1,
        "kernels": {"flash-attn": {"version": "2.8.3"}},
        "targets": {
            "default": {"matrix": {"toolkit": ["cuda13.0"], "torch": ["2.14.1"], "python": ["3.11"]}}
        },
        "destinations": destinations,
    }
    path = project / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    return path
