"""The Triton-profile wheel for real: flash-attn 2.8.3's own setup.py, then a fresh venv that imports it.

The release target's Triton cell (rocm6.4, torch 2.9) is built against a stand-in torch, 2.13.0+cpu from
/opt/wheels: setup.py only imports torch for this build, any build does (no ROCm torch is reachable here).
The wheel is installed into a fresh venv with the same CPU torch and triton 3.6.0 from PyPI (a CUDA/HIP
triton build; on a ROCm machine pytorch-triton-rocm provides the module) and imported with
FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE. On CPU, the wheel's Triton-backend module is exercised through its
PyTorch reference path (FLASH_ATTENTION_TRITON_AMD_REF=1) against SDPA; its Triton kernels need an AMD GPU
and never ran here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from attnforge.rocm.triton_wheel import (
    TritonWheelInputs,
    TritonWheelResult,
    build_triton_wheel,
    make_build_python,
    verify_triton_wheel,
)

from attnforge.matrix.cell import Cell
from attnforge.matrix.compat import load_compat
from attnforge.matrix.file import parse_matrix
from attnforge.matrix.plan import plan_target
from attnforge.rocm.backends import plan_rocm_build
from tests.integration.rocm_triton import (
    TORCH,
    TORCH_CPU,
    TRITON,
    check_triton_backend,
    flash_attention_env,
    flash_attn_sdist,
    fresh_venv,
    import_flash_attn,
    pip_sources,
)

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

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


@pytest.fixture(scope="module")
def cell() -> Cell:
    plan = plan_target(parse_matrix((ROOT / "matrix.yaml").read_text()), "release", load_compat())
    (triton,) = [c for c in plan.valid if c.profile == "triton"]
    return triton


@pytest.fixture(scope="module")
def sdist(cell: Cell, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert cell.source_sha256
    return flash_attn_sdist(cell.source_sha256, tmp_path_factory.mktemp("sdist") / "flash_attn-2.8.3.tar.gz")


@pytest.fixture(scope="module")
def build_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not TORCH_CPU.is_file():
        pytest.skip(f"the CPU torch stand-in {TORCH_CPU} is not on this machine")
    venv = tmp_path_factory.mktemp("buildvenv") / "venv"
    return make_build_python(venv, [TORCH, "setuptools", "wheel"], pip_sources())


@pytest.fixture(scope="module")
def built(
    cell: Cell, sdist: Path, build_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> TritonWheelResult:
    out = tmp_path_factory.mktemp("wheels")
    return build_triton_wheel(sdist, TritonWheelInputs.from_cell(cell), out, python=str(build_python))


def test_the_wheel_is_the_cells_pure_python_triton_wheel(cell: Cell, built: TritonWheelResult) -> None:
    assert built.wheel.name == "flash_attn-2.8.3+rocm6.4torch2.9cxx11abiTRUE.triton-py3-none-any.whl"
    assert built.built_as == "flash_attn-2.8.3+rocm6.4torch2.9cxx11abitrue.triton-py3-none-any.whl"  # PEP 440
    assert built.check.tag == "py3-none-any" and built.check.root_is_purelib
    assert built.check.triton_amd_files >= 10
    assert built.build_torch["torch"] == "2.13.0+cpu" and built.build_torch["hip"] is None  # no HIP torch
    with zipfile.ZipFile(built.wheel) as zf:
        names = zf.namelist()
    assert not [n for n in names if n.endswith(".so")]
    assert "flash_attn/flash_attn_triton_amd/fwd_prefill.py" in names
    plan = plan_rocm_build(cell)
    assert built.env == plan.env  # the build used exactly the plan's knobs
    fields = built.manifest_fields(cell.arches)
    assert fields["rocm_backend"] == "triton" and fields["compiled_arches"] == []
    assert verify_triton_wheel(built.wheel, TritonWheelInputs.from_cell(cell)).members == built.check.members


def test_same_inputs_same_bytes(cell: Cell, sdist: Path, build_python: Path, built: TritonWheelResult,
                                tmp_path: Path) -> None:  # fmt: skip
    again = build_triton_wheel(sdist, TritonWheelInputs.from_cell(cell), tmp_path, python=str(build_python))
    assert again.sha256 == built.sha256


def test_installs_and_imports_in_a_fresh_venv(built: TritonWheelResult, tmp_path: Path) -> None:
    start = time.monotonic()
    python = fresh_venv(tmp_path / "venv", [TORCH, TRITON, str(built.wheel)])
    installed = time.monotonic() - start
    without = subprocess.run(
        [str(python), "-W", "ignore", "-c", "import flash_attn"], capture_output=True, text=True,
        env=flash_attention_env(), cwd=tmp_path, check=False,
    )  # fmt: skip
    assert without.returncode != 0
    assert "No module named 'flash_attn_2_cuda'" in without.stderr  # the switch is needed at import time
    info = import_flash_attn(python, tmp_path)
    check_triton_backend(info, tmp_path / "venv")
    assert info["hip"] is None
    ref = subprocess.run(
        [str(python), "-W", "ignore", "-c", REFERENCE], capture_output=True, text=True, check=False, cwd=tmp_path,
        env=flash_attention_env(FLASH_ATTENTION_TRITON_AMD_ENABLE="TRUE", FLASH_ATTENTION_TRITON_AMD_REF="1"),
    )  # fmt: skip
    assert ref.returncode == 0, ref.stderr[-3000:]
    diffs = json.loads(ref.stdout.strip().splitlines()[-1])
    assert max(diffs.values()) < 2e-3  # the reference path returns fp16: rounding, not a wrong answer
    print(f"\ninstall {installed:.0f} s; import: {info}; reference vs SDPA: {diffs}", file=sys.stderr)
