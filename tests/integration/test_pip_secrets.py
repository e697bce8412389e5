"""A build whose torch comes from a private index with a password: the password reaches pip, and nothing else.

Real parts: pypiserver requiring the password for every read (htpasswd), this machine's pip configuration
naming it with the password in the URL (PIP_CONFIG_FILE, as an inherited pip.conf), the engine and the
docker backend running the real builder in the cuda-builder image on the real flash-attn 2.8.3 sdist. The
index holds a stand-in torch (a small wheel with torch's version, CUDA and ABI facts) and the build
requirements, so the build's venv step installs from it through the netrc the backend gives pip (the host makes
the venv while the image is prepared, the container reuses it); the build then stops at the host-compiler
probe (the stand-in has no headers): no flash-attn unit is compiled.

While it runs, every process's command line and environment on this machine (container processes included)
is sampled; afterwards the spec, the engine's log, the builder's log and result, the venv's marker and the
`docker run` line are searched for the password. A full proof would also run a real default build (real
torch on the private index, the compile) and `images build` with the same pip.conf: see reports/reliability.md.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from attnforge.engine.backends.docker import DockerBackend
from attnforge.engine.progress import PlainProgressView
from attnforge.engine.run import Engine
from attnforge.matrix.project import Project
from attnforge.wheels.wheelio import Member, write_wheel
from tests.integration.test_builder import FA_SHA256, builder_image, fa_sdist  # noqa: F401 (a fixture)
from tests.integration.wheelfactory import pypiserver

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
]  # ~30-45 s: unpack flash-attn 2.8.3, a venv from the index

USER = "forge"
SECRET = "SECRET-" + secrets.token_hex(12)
REQUIREMENTS = ["setuptools>=77", "wheel", "packaging", "ninja"]
TORCH_INIT = '__version__ = "2.14.1+cu130"\nfrom . import _C, version  # noqa\n'


def standin_torch(dest: Path) -> Path:
    """torch-2.14.1-py3-none-any.whl: what the builder's venv step reads of torch, nothing more."""
    dist_info = "torch-2.14.1.dist-info"
    members = {
        "torch/__init__.py": Member(TORCH_INIT.encode()),
        "torch/_C.py": Member(b"_GLIBCXX_USE_CXX11_ABI = True\n"),
        "torch/version.py": Member(b'cuda = "13.0"\nhip = None\n'),
        "torch/utils/__init__.py": Member(b""),
        "torch/utils/cpp_extension.py": Member(b"# a stand-in: no headers, nothing builds against it\n"),
        f"{dist_info}/METADATA": Member(b"Metadata-Version: 2.1\nName: torch\nVersion: 2.14.1\n\n"),
        f"{dist_info}/WHEEL": Member(b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    return write_wheel(dest, "torch-2.14.1-py3-none-any.whl", dist_info, members, 1700000000)


def build_requirements(dest: Path) -> None:
    """The builder's default requirements as wheels (this machine's pip configuration; cached per user)."""
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnforge" / "build-requirements"
    )
    if not list(cache.glob("ninja-*.whl")):
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(cache),
        ]
        subprocess.run([*cmd, *REQUIREMENTS], check=True, capture_output=True, text=True)
    for wheel in cache.glob("*.whl"):
        (dest / wheel.name).write_bytes(wheel.read_bytes())


class ProcessWatch:
    """Samples every process's command line and environment until stopped; keeps those holding `needle`."""

    def __init__(self, needle: str) -> None:
        self.needle = needle.encode()
        self.hits: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                for part in ("cmdline", "environ"):
                    try:
                        data = (proc / part).read_bytes()
                    except OSError:
                        continue
                    if self.needle in data:
                        shown = data.replace(b"\0", b" ")[:200]
                        self.hits.append(f"{proc.name}/{part}: {shown!r}")
            self.samples += 1
            self._stop.wait(0.02)


def files_under(*roots: Path) -> Iterator[Path]:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and path.stat().st_size < 50_000_000 and "site-packages" not in path.parts:
                yield path


@pytest.fixture
def private_index(tmp_path: Path) -> Iterator[str]:
    with pypiserver(tmp_path / "pypi", USER, SECRET, authenticate="download,list,update") as served:
        packages = tmp_path / "pypi" / "packages"
        standin_torch(packages)
        build_requirements(packages)
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(served.url + "/simple/torch/", timeout=10)
        assert anonymous.value.code == 401  # a private index: no read without the password
        yield served.url


def test_a_private_index_password_reaches_pip_and_nothing_else(
    private_index: str,
    builder_image: str,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    root: Path,
) -> None:
    sdist = fa_sdist()
    if sdist is None:
        pytest.skip("flash_attn-2.8.3.tar.gz not reachable (set ATTNFORGE_FA_SDIST)")
    host = private_index.removeprefix("http://")
    conf = tmp_path / "pip.conf"  # this machine's pip configuration, as a user would have it
    conf.write_text(f"[global]\nindex-url = http://{USER}:{SECRET}@{host}/simple/\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    data = yaml.safe_load((root / "matrix.yaml").read_text())
    data["kernels"]["flash-attn"]["source"] = {"kind": "path", "path": str(sdist), "sha256": FA_SHA256}
    data["build"] |= {"cache_dir": str(tmp_path / "cache"), "output_dir": str(tmp_path / "wheels")}
    data["build"]["pip"] = {"inherit_host_config": True}
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    project = Project(tmp_path / "matrix.yaml")
    cell = project.plan("default").valid[0]
    backend = DockerBackend(project)
    monkeypatch.setattr(backend, "ensure_builder", lambda toolkit, view: builder_image)  # the test's image
    lines: list[list[str]] = []
    make_line = backend.run_command

    def recorded(job: Any) -> list[str]:
        lines.append(make_line(job))
        return lines[-1]

    monkeypatch.setattr(backend, "run_command", recorded)
    with PlainProgressView() as view, ProcessWatch(SECRET) as watch:
        results = Engine(project, backend, view).build([cell])
    assert watch.samples > 20 and watch.hits == []

    log = (tmp_path / "wheels" / "logs" / f"{cell.id}.log").read_text()
    assert results[0].status == "failed"  # the stand-in torch has no headers: stopped after the venv step
    # the host made the venv while the image was prepared (engine/venv_ahead.py), with the netrc at its host
    # path; the builder in the container reused it
    venv_log = (tmp_path / "wheels" / "logs" / "venv-cp311-torch2.14.1-cu130.log").read_text()
    assert "Successfully installed" in venv_log and "torch-2.14.1" in venv_log, venv_log[-3000:]
    assert f"--index-url http://{host}/simple/" in venv_log  # the URL is there, its password is not
    assert '"stage": "venv", "status": "done"' in log and "reusing venv" in log, log[-3000:]

    netrc = backend.netrc.path()
    assert netrc is not None and SECRET in netrc.read_text()  # the one place it is, mode 600, removed at exit
    assert len(lines) == 1
    argv = " ".join(lines[0])
    assert (
        SECRET not in argv
        and "NETRC=/run/secrets/pip_netrc" in argv
        and f"{netrc}:/run/secrets/pip_netrc:ro" in argv
    )
    leaks = [
        str(p)
        for p in files_under(tmp_path / "wheels", tmp_path / "cache")
        if SECRET.encode() in p.read_bytes()
    ]
    assert leaks == []
    specs = list((tmp_path / "cache").rglob("spec.json"))
    assert specs and all(f"http://{host}/simple/" in s.read_text() for s in specs)
    history = subprocess.run(
        ["/usr/bin/docker", "history", "--no-trunc", builder_image],
        capture_output=True,
        text=True,
        check=True,
    )
    assert SECRET not in history.stdout
