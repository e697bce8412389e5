"""docker/rocm-builder.Dockerfile with real `docker build` (BuildKit, /usr/bin/docker) on stand-in bases.

No ROCm toolchain is reachable here, so nothing below is a ROCm build:
- the Debian stand-in (`local/debian:bookworm`) must stop at the toolchain stage with the hipcc message;
- a "fake-rocm" stand-in (a shell script named hipcc and an /opt/rocm/.info/version file, NOT a toolchain)
  drives the version check both ways;
- ROCM_BACKEND=triton needs no hipcc: the whole image builds on Debian (apt through the CA secret).
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnforge.core.docker_cli import docker_executable
from attnforge.core.package_files import packaged_docker_dir
from attnforge.engine.backends.debian_base import BaseImageError, bootstrap_debian_base, image_id

pytestmark = [pytest.mark.docker]

DOCKER = docker_executable()  # ATTNFORGE_DOCKER, as attnforge itself
DOCKERFILE = packaged_docker_dir() / "rocm-builder.Dockerfile"
STANDIN = "local/debian:bookworm"
CA = Path("/etc/ssl/certs/ca-certificates.crt")
HIPCC_MSG = "no hipcc in the base image: use a rocm/dev-ubuntu base"
FAKE_ROCM = """\
FROM {base}
RUN mkdir -p /opt/rocm/bin /opt/rocm/.info \\
 && printf '#!/bin/sh\\necho "HIP version: {ver}-FAKE (a stand-in script, not a ROCm toolchain)"\\n' \\
    > /opt/rocm/bin/hipcc && chmod +x /opt/rocm/bin/hipcc && echo "{ver}-1" > /opt/rocm/.info/version
"""


def docker_build(
    ctx: Path, *args: str, tag: str | None = None, stdin: str | None = None, cache: bool = False
) -> subprocess.CompletedProcess[str]:
    """`docker build` with BuildKit; uncached by default, so the steps' own output is in the log."""
    cmd = [DOCKER, "build", "--progress", "plain", "-f", "-" if stdin is not None else str(DOCKERFILE)]
    cmd += [] if cache else ["--no-cache"]
    if CA.exists():
        cmd += ["--secret", f"id=ca_bundle,src={CA}"]
    cmd += [*args, *(["-t", tag] if tag else []), str(ctx)]
    return subprocess.run(
        cmd,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
    )


@pytest.fixture(scope="module")
def standin() -> str:
    if image_id(STANDIN) is None:
        try:
            bootstrap_debian_base(STANDIN)
        except BaseImageError as exc:
            pytest.skip(f"no {STANDIN} and cannot make it: {exc}")
    return STANDIN


@pytest.fixture
def ctx(tmp_path: Path) -> Path:
    """An empty build context: the Dockerfile copies nothing."""
    d = tmp_path / "ctx"
    d.mkdir()
    return d


@pytest.fixture
def tags() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for tag in made:
        subprocess.run([DOCKER, "rmi", "-f", tag], capture_output=True, check=False)


def test_ck_on_debian_standin_stops_at_the_toolchain(standin: str, ctx: Path) -> None:
    proc = docker_build(ctx, "--build-arg", f"BASE_IMAGE={standin}", "--build-arg", "ROCM_VERSION=6.4")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert HIPCC_MSG in out
    assert "[toolchain 2/2]" in out and "[builder" not in out  # failed early, before any apt download


def test_native_gpu_archs_is_refused(standin: str, ctx: Path) -> None:
    proc = docker_build(ctx, "--build-arg", f"BASE_IMAGE={standin}", "--build-arg", "GPU_ARCHS=native")
    assert proc.returncode != 0
    assert "GPU_ARCHS=native asks the build machine's GPU and builders have none" in proc.stdout + proc.stderr


def test_fake_rocm_version_check_both_ways(standin: str, ctx: Path, tags: list[str]) -> None:
    suffix = secrets.token_hex(4)
    for ver in ("6.3.2", "6.4.1"):
        tag = f"attnforge-test/fake-rocm-{suffix}:{ver}"
        made = docker_build(ctx, tag=tag, stdin=FAKE_ROCM.format(base=standin, ver=ver))
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
        tags.append(tag)
    old = docker_build(ctx, "--build-arg", f"BASE_IMAGE={tags[0]}", "--build-arg", "ROCM_VERSION=6.4")
    assert old.returncode != 0
    assert "the base image has ROCm 6.3.2, the cell wants ROCm 6.4" in old.stdout + old.stderr
    ok = docker_build(
        ctx,
        "--build-arg",
        f"BASE_IMAGE={tags[1]}",
        "--build-arg",
        "ROCM_VERSION=6.4",
        "--target",
        "toolchain",
    )
    out = ok.stdout + ok.stderr
    assert ok.returncode == 0, out[-3000:]
    assert "HIP version: 6.4.1-FAKE" in out
    assert "attnforge rocm-builder: ROCm 6.4.1, hipcc /opt/rocm/bin/hipcc, GPU_ARCHS=gfx90a;gfx942" in out


def test_triton_toolchain_stage_needs_no_hipcc(standin: str, ctx: Path) -> None:
    proc = docker_build(
        ctx,
        "--build-arg",
        f"BASE_IMAGE={standin}",
        "--build-arg",
        "ROCM_BACKEND=triton",
        "--target",
        "toolchain",
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "ROCM_BACKEND=triton: no device code is compiled at build time" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_triton_builder_image_builds_on_debian(standin: str, ctx: Path, tags: list[str]) -> None:
    """The whole image (apt through the CA secret, ~1 min); the CA never lands in a layer."""
    tag = f"attnforge-test/rocm-builder-triton:{secrets.token_hex(4)}"
    proc = docker_build(
        ctx, "--build-arg", f"BASE_IMAGE={standin}", "--build-arg", "ROCM_BACKEND=triton", tag=tag
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    tags.append(tag)
    run = subprocess.run(
        [
            DOCKER,
            "run",
            "--rm",
            tag,
            "bash",
            "-c",
            "python3 --version && g++ --version && ninja --version "
            "&& echo BUILD_TARGET=$BUILD_TARGET && ls -A /run/secrets 2>/dev/null | wc -l",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "Python 3." in run.stdout and "BUILD_TARGET=rocm" in run.stdout
    assert run.stdout.strip().splitlines()[-1] == "0"  # no secret file left in the image
    history = subprocess.run(
        [DOCKER, "history", "--no-trunc", tag], capture_output=True, text=True, check=True
    ).stdout
    assert "BEGIN CERTIFICATE" not in history
    labels = subprocess.run(
        [DOCKER, "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert '"io.attnforge.rocm-backend":"triton"' in labels
