"""An aarch64 cell built for real on an x86-64 machine: `attnforge build --target aarch64` cross-compiles it
(builder/cross.py: aarch64-linux-gnu-g++, torch's aarch64 wheel, the CUDA sbsa target files from NVIDIA's
aarch64 wheels in the cross image) and the wheel is checked without running it: its extension is an AArch64
ELF, its platform tag linux_aarch64/manylinux_*_aarch64, its manifest the cell's platform and gencode.

All 5 kernel units are compiled (aarch64 host stubs: no x86-64 objects are reused), about 10-15 minutes on 2
cores plus two torch downloads: not in CI (noxfile.CI_SLOW_ALLOWLIST says why); run it by hand with
`ATTNFORGE_RUN_ALL_SLOW=1 pytest tests/integration/test_build_aarch64.py`.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from .conftest import InstalledAttnforge

pytestmark = [pytest.mark.docker, pytest.mark.slow]
CELL = "flash-attn-2.8.3-cu130-torch2.14.1-cp312-abi1-sm90-fwd128-aarch64"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, installed_attnforge: InstalledAttnforge) -> Path:
    """The aarch64 target's cp312 cell, built once into a private output and cache folder."""
    root = Path(__file__).resolve().parents[2]
    tmp = tmp_path_factory.mktemp("build-aarch64")
    data = yaml.safe_load((root / "matrix.yaml").read_text())
    data["build"]["output_dir"] = str(tmp / "wheels")
    data["build"]["cache_dir"] = str(tmp / "cache")
    matrix = tmp / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = installed_attnforge.run(
        "--matrix", str(matrix), "build", "--cell", CELL, cwd=tmp, timeout=3600, CI="1"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "wheels"


def test_the_wheel_is_aarch64_code(built: Path, tmp_path: Path) -> None:
    (wheel,) = sorted(built.glob("flash_attn-2.8.3+*aarch64.whl"))
    assert "-cp312-cp312-" in wheel.name and "x86_64" not in wheel.name
    manifest = json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text())
    assert manifest["cell_id"] == CELL and manifest["inputs"]["platform"] == "aarch64"
    assert manifest["inputs"]["gencode"] == ["arch=compute_90,code=sm_90", "arch=compute_90,code=compute_90"]
    assert manifest["build"]["units_total"] == 5
    with zipfile.ZipFile(wheel) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        assert so.endswith(".cpython-312-aarch64-linux-gnu.so")
        path = Path(zf.extract(so, tmp_path))
    header = subprocess.run(["readelf", "-h", str(path)], capture_output=True, text=True, check=True).stdout
    assert "AArch64" in header
