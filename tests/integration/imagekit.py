"""What the image tests share: the packages pip installs inside the images, the NGC stand-in, real mini
flash_attn wheels compiled inside it, and the compat row that names the stand-in's release.

Packages come the way they come on a user's machine: `pip download` through the pip running the tests, with
its configuration and cache (whatever index, find-links or proxy that user has), into a temporary folder,
then served by an authenticated local index the test starts (`LocalIndexServer`); the builds reach that
index alone. No path of a particular machine's mirrors is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from attnforge.core.docker_cli import docker_executable
from attnforge.core.pins import cpu_torch
from attnforge.engine.backends.localindex import LocalIndexServer, Sources
from attnforge.images.standin import standin_torch_version

ROOT = Path(__file__).resolve().parents[2]
MINI = ROOT / "tests" / "integration" / "data" / "mini_flash_attn"
DOCKER = docker_executable()  # ATTNFORGE_DOCKER, as attnforge itself
CA = Path("/etc/ssl/certs/ca-certificates.crt")  # the host's CA bundle, given to the builds as a secret
RELEASE = "99.09"  # the stand-in's release name (a test row below, not a real NGC release)
IMAGE_PYTHON = "3.11"  # the Python of the images: Debian bookworm's (local base, stand-in)
TORCH = cpu_torch()  # torch==2.13.0+cpu: the 190 MB CPU wheel instead of the 5 GB CUDA one
STANDIN_TORCH = standin_torch_version(TORCH)  # what the stand-in's relabelled torch reports
# What pip installs inside the image builds: torch (+ its dependencies) in the runtime images and the
# stand-in, ninja and packaging in the stand-in (docker/ngc-standin/Dockerfile).
PACKAGES = [TORCH, "ninja", "packaging"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
PACKAGED_COMPAT = ROOT / "src" / "attnforge" / "data" / "compat.toml"
STANDIN_ROW = f"""
[[ngc]]
release = "{RELEASE}"
torch = "{STANDIN_TORCH}"
cuda = "13.0"
python = "{IMAGE_PYTHON}"
flash_attn = "2.7.4+standin"
source = "attnforge test row: the stand-in's release, not a real NGC release"
"""


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check)


def download_packages(dest: Path) -> Path:
    """`pip download` of PACKAGES and their dependencies for the images' Python and platform into `dest`,
    through the test's own pip (its configuration and cache, as on a user's machine)."""
    nodot = IMAGE_PYTHON.replace(".", "")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        "--only-binary=:all:",
        "--python-version",
        IMAGE_PYTHON,
        "--implementation",
        "cp",
        "--abi",
        f"cp{nodot}",
    ]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    proc = subprocess.run([*cmd, *PACKAGES], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.fail(
            f"pip could not download {' '.join(PACKAGES)} for cp{nodot} with this machine's pip "
            f"configuration (the test venv's torch comes from the same place):\n{proc.stderr[-2000:]}"
        )
    return dest


@contextmanager
def package_index(work: Path, user: str, password: str) -> Iterator[tuple[str, Path]]:
    """(url, netrc) of an authenticated local PEP 503 index of what pip downloaded for the images; the
    credentials are only in the netrc. The downloaded copy of torch is removed when the index stops (pytest
    keeps three sessions' temp folders)."""
    netrc = work / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login {user} password {password}\n")
    packages = download_packages(work / "packages")
    with LocalIndexServer(Sources([packages]), username=user, password=password) as srv:
        yield srv.url, netrc
    shutil.rmtree(packages)


def write_compat(path: Path) -> Path:
    """The packaged compat tables plus the stand-in's [[ngc]] row (the rules check the NGC cell)."""
    path.write_text(PACKAGED_COMPAT.read_text() + STANDIN_ROW)
    return path


def mini_wheels(out: Path, standin: str, variants: dict[str, tuple[str, list[str]]]) -> Path:
    """Real wheels of the mini flash_attn, compiled once inside the stand-in against its torch (each further
    variant reuses the objects), with manifests naming the CUDA variants they claim: variants maps a local
    version to (toolkit, arches)."""
    out.mkdir(parents=True, exist_ok=True)
    script = (
        "set -e; cp -a /src /tmp/b; cd /tmp/b; export PIP_CONSTRAINT= PIP_CONFIG_FILE=/dev/null; "
        + " ".join(
            f"FLASH_ATTN_LOCAL_VERSION={lv} python -m pip wheel -q --no-build-isolation --no-deps --no-index -w /out .;"
            for lv in variants
        )
        + f" chown -R {os.getuid()} /out"
    )
    docker(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{MINI}:/src:ro",
        "-v",
        f"{out}:/out",
        standin,
        "bash",
        "-c",
        script,
    )
    for wheel in sorted(out.glob("flash_attn-*.whl")):
        local = next(lv for lv in variants if lv.lower() in wheel.name.lower())
        manifest = _manifest(wheel, local, *variants[local])
        (out / f"{wheel.name}.manifest.json").write_text(json.dumps(manifest, indent=2))
    assert len(list(out.glob("*.manifest.json"))) == len(variants)
    return out


def _manifest(wheel: Path, local: str, toolkit: str, arches: list[str]) -> dict[str, Any]:
    """A build-engine-style manifest for a wheel built outside the engine (a CPU build labelled `local`)."""
    short = local.split("torch")[0]
    torch_release = TORCH.split("==")[1].split("+")[0]
    data = wheel.read_bytes()
    return {
        "schema": 1,
        "cell_id": f"flash-attn-2.8.3-{short}-torch{torch_release}-cp{IMAGE_PYTHON.replace('.', '')}-abi1-"
        f"{'-'.join(arches)}-full-x86_64",
        "variant": f"{short}-torch{'.'.join(torch_release.split('.')[:2])}",
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "wheel": wheel.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "inputs": {
            "toolkit": toolkit,
            "torch": torch_release,
            "torch_variant": "cpu",
            "python": IMAGE_PYTHON,
            "cxx11_abi": True,
            "arches": arches,
            "profile": "full",
            "profile_flags": [],
        },
        "toolchain": {"torch": TORCH.split("==")[1]},
        "parity": None,
    }


def remove_repository(repo: str) -> None:
    """Remove the local tags of one image repository (exactly `repo`, any registry prefix)."""
    refs = docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    mine = [r for r in refs if r.rsplit(":", 1)[0] == repo or r.rsplit(":", 1)[0].endswith(f"/{repo}")]
    if mine:
        docker("rmi", "-f", *mine, check=False)
