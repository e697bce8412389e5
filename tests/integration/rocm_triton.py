"""Shared by the ROCm Triton tests: the flash-attn 2.8.3 sdist, offline pip sources, the fresh-venv check.

The sdist: `test_builder.fa_sdist()` ($ATTNFORGE_FA_SDIST, else fetched once into the user cache). Packages
(the CPU torch stand-in of data/pins.toml, triton) come through the test's pip and its configuration, as on a
user's machine.

The fresh-venv check, as both tests run it: `fresh_venv` (a new venv with the CPU torch stand-in and triton,
the wheel beside them or installed after with `pip_install`), `import_flash_attn` (IMPORT run with
FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE), `check_triton_backend` (the venv's wheel picked the Triton backend).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from attnforge.builder.files import sha256_file as sha256_of
from attnforge.core.pins import cpu_torch

from .test_builder import fa_sdist

ROOT = Path(__file__).resolve().parents[2]
NAME = "flash_attn-2.8.3.tar.gz"
TRITON = "triton==3.6.0"
TORCH = cpu_torch()  # the stand-in the wheel is built and imported beside
BACKEND = "flash_attn.flash_attn_triton_amd.interface_fa"

# Run with FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE: which backend flash_attn picked, and from where.
IMPORT = """\
import importlib.util, json, torch, flash_attn
import flash_attn.flash_attn_interface as fi
print(json.dumps({"flash_attn": flash_attn.__version__, "file": flash_attn.__file__,
                  "backend": fi.flash_attn_gpu.__name__, "torch": torch.__version__,
                  "hip": torch.version.hip,
                  "flash_attn_2_cuda": importlib.util.find_spec("flash_attn_2_cuda") is not None}))
"""


def flash_attn_sdist(sha256: str) -> Path:
    """flash-attn 2.8.3's sdist, checked against `sha256` (the matrix's pin)."""
    sdist = fa_sdist()
    assert sdist is not None, "flash-attn 2.8.3's sdist is not reachable"
    assert sha256_of(sdist) == sha256, f"{sdist}: sha256 differs from the pin"
    return sdist


def pip_install(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`pip install --progress-bar off` with `python`'s pip and its configuration; output captured, not checked."""
    cmd = [str(python), "-m", "pip", "install", "--progress-bar", "off", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def fresh_venv(venv: Path, requirements: list[str]) -> Path:
    """A new venv at `venv` (this interpreter, `-m venv`) with `requirements` pip-installed; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    proc = pip_install(python, "-q", *requirements)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return python


def flash_attention_env(**extra: str) -> dict[str, str]:
    """This environment without any FLASH_ATTENTION* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASH_ATTENTION")}
    return {**env, **extra}


def import_flash_attn(python: Path, cwd: Path) -> dict[str, Any]:
    """Run IMPORT with `python` in `cwd`, FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE; the JSON it printed."""
    proc = subprocess.run(
        [str(python), "-W", "ignore", "-c", IMPORT],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=flash_attention_env(FLASH_ATTENTION_TRITON_AMD_ENABLE="TRUE"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return info


def check_triton_backend(info: dict[str, Any], venv: Path) -> None:
    """flash-attn 2.8.3 from `venv` imported with its Triton backend, no `flash_attn_2_cuda` anywhere."""
    assert info["flash_attn"] == "2.8.3"
    assert info["backend"] == BACKEND
    assert info["flash_attn_2_cuda"] is False and str(venv) in info["file"]
