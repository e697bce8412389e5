"""`attnforge build --cell <the release target's ROCm Triton cell>` for real, then install and import the wheel.

What `nox -s build-wheels -- --cell ID` runs (the noxfile passes its arguments to `attnforge build`; without
--target a --cell is looked up in every target). The build goes through the engine with the default
`--backend auto` (docker answers here, and gets no cell): the cell is routed to the local backend, whose
builder runs flash-attn 2.8.3's own setup.py with the Triton knobs in a cached venv with torch 2.13.0+cpu as a
stand-in (nothing is compiled; no ROCm torch is reachable here), then finalize, manifest and the atomic move.
The wheel is installed with pip into a fresh venv beside torch 2.13.0+cpu and triton 3.6.0, and imported
with FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE. The Triton kernels themselves need an AMD GPU: never run here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from attnforge.matrix.cell import Cell
from attnforge.matrix.compat import load_compat
from attnforge.matrix.file import parse_matrix
from attnforge.matrix.plan import plan_target
from tests.integration.rocm_triton import (
    NAME,
    TORCH,
    TRITON,
    check_triton_backend,
    flash_attention_env,
    flash_attn_sdist,
    fresh_venv,
    import_flash_attn,
    pip_install,
)

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "attnforge"

REFERENCE = """\
import json, math, torch
import flash_attn.flash_attn_interface as fi
torch.manual_seed(0)
q, k, v = (torch.randn(2, 128, 4, 64) for _ in range(3))
diffs = {}
for causal in (False, True):
    out = fi.flash_attn_gpu.fwd(q, k, v, None, None, 0.0, 1 / math.sqrt(64), causal, -1, 0 if causal else -1,
                                0.0, False)[0]
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
    diffs[str(causal)] = (out.float() - ref).abs().max().item()
print(json.dumps(diffs))
"""


@dataclass
class Build:
    """One `attnforge build` run in a scratch project (a copy of matrix.yaml)."""

    wheel: Path
    manifest: dict[str, Any]
    stderr: str
    seconds: float


def attnforge(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command line, in `project` (its matrix.yaml: output and cache land beside it)."""
    cmd = [str(CLI), "--matrix", str(project / "matrix.yaml"), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASH_ATTENTION", "MAX_JOBS"))}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=project, env=env, check=False, timeout=900)


@pytest.fixture(scope="module")
def cell() -> Cell:
    plan = plan_target(parse_matrix((ROOT / "matrix.yaml").read_text()), "release", load_compat())
    (triton,) = [c for c in plan.valid if c.profile == "triton"]
    return triton


@pytest.fixture(scope="module")
def project(cell: Cell, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """matrix.yaml unchanged (same cell ids) in a scratch folder, the sdist already in its cache."""
    root = tmp_path_factory.mktemp("triton-project")
    shutil.copy(ROOT / "matrix.yaml", root / "matrix.yaml")
    sources = root / ".attnforge-cache" / "sources"
    sources.mkdir(parents=True)
    assert cell.source_sha256
    shutil.copy(flash_attn_sdist(cell.source_sha256), sources / NAME)
    return root


@pytest.fixture(scope="module")
def built(project: Path, cell: Cell) -> Build:
    start = time.monotonic()
    proc = attnforge(project, "build", "--cell", cell.id, "--quiet")
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-4000:]
    wheels = sorted((project / "wheels").glob("*.whl"))
    assert [w.name for w in wheels] == [cell.wheel_name]
    manifest = json.loads((project / "wheels" / f"{cell.wheel_name}.manifest.json").read_text())
    print(f"\nattnforge build --cell {cell.id}: {seconds:.0f} s", file=sys.stderr)
    return Build(wheels[0], manifest, proc.stderr, seconds)


def test_routed_to_the_triton_backend_and_finalized(project: Path, cell: Cell, built: Build) -> None:
    assert cell.wheel_name == "flash_attn-2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton-py3-none-any.whl"
    assert "backend: local for 1 cell(s)" in built.stderr
    m = built.manifest
    assert m["cell_id"] == cell.id and m["wheel"] == built.wheel.name
    assert m["local_version"] == "rocm6.4torch2.9cxx11abiTRUE.triton" and m["variant"] == "rocm6.4-torch2.9"
    assert m["build"]["backend"] == "local" and m["build"]["units_total"] == 0
    assert m["inputs"]["rocm_backend"] == "triton"
    assert m["rocm"]["rocm_backend"] == "triton" and m["rocm"]["ck_kernels"] is False
    assert m["rocm"]["compiled_arches"] == [] and m["rocm"]["target_arches"] == ["gfx90a", "gfx942"]
    assert m["rocm"]["pure_python"] is True and m["toolchain"]["torch"] == "2.13.0+cpu"
    assert m["rocm"]["build_torch"] == "2.13.0+cpu" and m["rocm"]["import_env"] == {
        "FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"
    }
    assert m["platform_tag"]["tag"] == "any"
    assert m["finalize"]["torch_requirement"] == "torch==2.9.*"
    assert "auditwheel" not in m["finalize"]["checks"] and "pure-python" in m["finalize"]["checks"]
    assert m["size"] == built.wheel.stat().st_size
    with zipfile.ZipFile(built.wheel) as zf:
        names = zf.namelist()
        dist_info = "flash_attn-2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton.dist-info"
        meta = zf.read(f"{dist_info}/METADATA").decode()
        wheel_file = zf.read(f"{dist_info}/WHEEL").decode()
        record = json.loads(zf.read(f"{dist_info}/attnforge_build.json"))
    assert "Requires-Dist: torch==2.9.*" in meta.splitlines()
    assert "Tag: py3-none-any" in wheel_file and "Root-Is-Purelib: true" in wheel_file
    assert not [n for n in names if n.endswith((".so", ".o", ".hsaco"))]
    assert "flash_attn/flash_attn_triton_amd/interface_fa.py" in names
    assert record["rocm"]["ck_kernels"] is False and record["platform_tag"] == "any"
    log = (project / "wheels" / "logs" / f"{cell.id}.log").read_text()
    assert "(local)" in log and "Successfully built flash_attn" in log
    assert not re.search(r"^\s*\[\d+/\d+\] ", log, re.MULTILINE)  # no ninja edge: nothing compiled
    assert sum(1 for n in names if n.startswith("flash_attn/flash_attn_triton_amd/")) >= 10
    assert not list((project / "wheels").glob(".staging-*"))  # moved in atomically, staging removed
    verify = attnforge(project, "wheels", "verify", str(built.wheel))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # the engine signed what it built (docs/records.md): publish's every check passes on it (a dry run)
    for suffix in (".provenance.intoto.json", ".cdx.json"):
        assert built.wheel.with_name(built.wheel.name + suffix).is_file(), suffix
    dry = attnforge(project, "publish", "--to", "./dry-index", "--dry-run", str(built.wheel))
    assert dry.returncode == 0 and f"would add {built.wheel.name}" in dry.stderr, dry.stderr


def test_unchanged_cell_is_skipped(project: Path, cell: Cell, built: Build) -> None:
    before = built.wheel.read_bytes()
    proc = attnforge(project, "build", "--cell", cell.id, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipped" in proc.stderr
    assert built.wheel.read_bytes() == before


def test_same_inputs_same_bytes(project: Path, cell: Cell, built: Build) -> None:
    before = built.wheel.read_bytes()
    proc = attnforge(project, "build", "--cell", cell.id, "--quiet", "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reusing venv" in (project / "wheels" / "logs" / f"{cell.id}.log").read_text()
    assert built.wheel.read_bytes() == before


def test_installs_beside_cpu_torch_and_imports(built: Build, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    start = time.monotonic()
    py = fresh_venv(venv, [TORCH, TRITON, "einops"])
    # the wheel pins torch 2.9 (its cell's); pip refuses it next to torch 2.13 unless told not to resolve
    refused = pip_install(py, "--dry-run", str(built.wheel), TORCH)
    assert refused.returncode != 0 and "torch==2.9.*" in refused.stdout + refused.stderr
    inst = pip_install(py, "-q", "--no-deps", str(built.wheel))
    assert inst.returncode == 0, inst.stderr[-3000:]
    installed = time.monotonic() - start
    info = import_flash_attn(py, tmp_path)
    check_triton_backend(info, venv)
    assert info["torch"] == "2.13.0+cpu"
    dist = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('flash-attn'))"],
        capture_output=True,
        text=True,
    )
    assert dist.stdout.strip() == "2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton"
    without = subprocess.run(
        [str(py), "-W", "ignore", "-c", "import flash_attn"],
        capture_output=True,
        text=True,
        env=flash_attention_env(),
        cwd=tmp_path,
        check=False,
    )
    assert (
        without.returncode != 0 and "No module named 'flash_attn_2_cuda'" in without.stderr
    )  # switch needed
    ref = subprocess.run(
        [str(py), "-W", "ignore", "-c", REFERENCE],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env=flash_attention_env(FLASH_ATTENTION_TRITON_AMD_ENABLE="TRUE", FLASH_ATTENTION_TRITON_AMD_REF="1"),
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    diffs = json.loads(ref.stdout.strip().splitlines()[-1])
    assert max(diffs.values()) < 2e-3  # the reference path returns fp16: rounding, not a wrong answer
    print(f"\ninstall {installed:.0f} s; import: {info}; reference vs SDPA: {diffs}", file=sys.stderr)


def test_a_ck_cell_beside_it_fails_alone(project: Path, cell: Cell, built: Build) -> None:
    """A CK cell in the same run (as in `build -t release` on a CUDA machine) fails with what is missing;
    the Triton cell is still handled (here: skipped, unchanged) and the run exits 4 (a cell failed)."""
    plan = plan_target(parse_matrix((ROOT / "matrix.yaml").read_text()), "release", load_compat())
    ck = next(c for c in plan.valid if c.profile == "ck")
    proc = attnforge(project, "build", "--cell", cell.id, "--cell", ck.id, "--quiet")
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "ROCm CK cell(s) cannot be built on this machine" in proc.stderr and "hipcc" in proc.stderr
    assert "1 of 2 cell(s) failed" in proc.stderr and built.wheel.is_file()
