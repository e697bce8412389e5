"""`which` and `doctor` of an attnforge installed in its own venv (as pipx installs it: no torch there) look at
the user's environment: the active venv, or the first python3 on PATH, holding the CPU torch of the test
suite and a flash-attn wheel; against a real served index.

Reuses the session's torch 2.13.0+cpu venv and its finalized wheel (`wheelfactory`) and the installed
attnforge (`installed_attnforge`), which other integration tests make anyway: its own cost is one publish, one
server, one wheel install and four attnforge runs (each importing torch in the user's interpreter): 28-39 s
for the test itself on a 2-core machine under load (load average 11-14).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.integration.wheelfactory")

from tests.integration.conftest import InstalledAttnforge  # noqa: E402
from tests.integration.wheelfactory import (  # noqa: E402
    Served,
    TorchEnv,
    attnforge_serve,
    cli,
    copy_wheel,
    fresh_env,
    pip_install,
    write_matrix,
)

pytest_plugins = ["tests.integration.wheelfactory"]

V213 = "2.8.3+cu130torch2.13cxx11abiTRUE"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, wheel213: Path) -> Iterator[Served]:
    project = tmp_path_factory.mktemp("which-user") / "proj"
    project.mkdir()
    write_matrix(project, local={"kind": "static", "path": "wheels/index", "require_parity": False})
    copy_wheel(wheel213, project / "wheels")
    assert cli("publish", "--to", "local", cwd=project).returncode == 0
    with attnforge_serve(project / "wheels" / "index", project / "serve.log") as served:
        yield served


@pytest.fixture(scope="module")
def user_env(tmp_path_factory: pytest.TempPathFactory, torch213: TorchEnv, wheel213: Path) -> Path:
    """The user's venv: the CPU torch, and the flash-attn wheel for it installed. Its root."""
    root = tmp_path_factory.mktemp("user") / "venv"
    python = fresh_env(root, torch213)
    assert pip_install(python, "--no-deps", wheel213).returncode == 0
    return root


def attnforge(
    installed: InstalledAttnforge, *args: str, venv: Path | None = None, path_first: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed attnforge, run by its path (its venv's bin is not on PATH, as with pipx), in an
    environment with `venv` active ($VIRTUAL_ENV) and/or `path_first` first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")}
    env["PATH"] = os.pathsep.join([*([str(path_first)] if path_first else []), "/usr/bin", "/bin"])
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
    return subprocess.run(
        [*installed.cli, *args], capture_output=True, text=True, timeout=300, env=env, check=False
    )


def test_which_and_doctor_inspect_the_active_venv_not_their_own(
    installed_attnforge: InstalledAttnforge, server: Served, user_env: Path
) -> None:
    own = subprocess.run([installed_attnforge.python, "-c", "import torch"], capture_output=True, check=False)
    assert own.returncode != 0  # attnforge's own venv has no torch: what it used to inspect
    python = user_env / "bin" / "python"

    # the venv is active: its CPU torch is what the wheels are compared with, and the report says so
    which = attnforge(installed_attnforge, "which", "--index-url", server.url, venv=user_env)
    assert which.returncode == 3 and which.stdout == "", which.stderr
    assert f"interpreter: {python} (Python 3.11." in which.stderr
    assert (
        "chosen by $VIRTUAL_ENV (the active venv)), torch 2.13.0+cpu (CPU-only, cxx11abi TRUE)"
        in which.stderr
    )
    assert "accelerator: wheel is cu130, torch 2.13.0+cpu is a CPU-only build" in which.stderr
    assert f"install a CUDA or ROCm build of torch into {python}" in which.stderr
    assert "--torch 2.13.0+cu130" in which.stderr and "install torch first" not in which.stderr
    next_step = (
        f"fits the environment of {python}; next: a CUDA build of torch in {python} (ask for its wheel"
    )
    assert next_step in which.stderr

    # the CUDA build of the same torch, asked for: the wheel of the index that fits that venv's Python
    which = attnforge(
        installed_attnforge, "which", "--index-url", server.url, "--torch", "2.13.0+cu130", venv=user_env
    )
    assert which.returncode == 0, which.stderr
    assert (
        which.stdout.strip()
        == f"pip install flash-attn=={V213} --index-url {server.url}/cu130-torch2.13/simple"
    )
    assert f"interpreter: {python} " in which.stderr and f"fits: flash_attn-{V213}-cp311-" in which.stderr

    # no venv active: the first python3 on PATH (the user's venv bin first), named so in the JSON
    which = attnforge(
        installed_attnforge, "which", "--index-url", server.url, "--torch", "2.13.0+cu130", "--json",
        path_first=user_env / "bin",
    )  # fmt: skip
    report = json.loads(which.stdout)
    assert report["wheel"].startswith(f"flash_attn-{V213}-")
    assert report["interpreter"]["path"] == str(user_env / "bin" / "python3")
    assert report["interpreter"]["chosen_by"] == "PATH"
    assert report["interpreter"]["torch"] == {
        "version": "2.13.0+cpu",
        "accelerator": "cpu",
        "cxx11_abi": True,
    }

    # doctor checks the flash-attn installed in the active venv: found, its extension loads with that torch
    doctor = attnforge(installed_attnforge, "doctor", venv=user_env)
    lines = doctor.stdout.splitlines()
    assert lines[0].startswith(f"ok   interpreter: {python} (Python 3.11."), doctor.stdout
    assert "torch 2.13.0+cpu (CPU-only, cxx11abi TRUE)" in lines[0]
    site = next((user_env / "lib").glob("python3*/site-packages"))
    assert f"ok   flash-attn: {V213} at {site}" in doctor.stdout
    assert "ok   import flash_attn_2_cuda: " + str(site) in doctor.stdout
    assert "ok   torch requirement: wheel requires torch==2.13.*, installed 2.13.0+cpu" in doctor.stdout
    # the wheel is labelled cuda13.0 (built against the CPU torch for the tests): the one real mismatch
    assert "fail accelerator: built with cuda13.0, torch here is a CPU-only build" in doctor.stdout
    assert doctor.returncode == 5 and "1 problem(s): accelerator" in doctor.stderr
