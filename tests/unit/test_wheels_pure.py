"""`wheels finalize` on a pure-Python (ROCm Triton) wheel: py3-none-any kept, no auditwheel, torch pinned."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from attnforge.core.errors import BuildError
from attnforge.wheels.finalize import PURE_REASON, finalize, verify
from attnforge.wheels.manifest import manifest_path_for
from attnforge.wheels.naming import expected_names
from attnforge.wheels.wheelio import Member, write_wheel

LOCAL = "rocm6.4torch2.9cxx11abiTRUE.triton"
BUILT_LOCAL = LOCAL.lower()  # setuptools normalizes the local version (PEP 440)
CELL_ID = "flash-attn-2.8.3-rocm6.4-torch2.9.1-cp312-abi1-gfx90a-gfx942-triton-x86_64"


def manifest(wheel: str, **inputs: Any) -> dict[str, Any]:
    """What the engine hands finalize for the release target's Triton cell."""
    return {
        "schema": 1,
        "cell_id": CELL_ID,
        "variant": "rocm6.4-torch2.9",
        "local_version": LOCAL,
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "wheel": wheel,
        "inputs": {
            "toolkit": "rocm6.4",
            "torch": "2.9.1",
            "torch_variant": "rocm6.4",
            "python": "3.12",
            "cxx11_abi": True,
            "arches": ["gfx90a", "gfx942"],
            "profile": "triton",
            "rocm_backend": "triton",
            **inputs,
        },
        "rocm": {"rocm_backend": "triton", "ck_kernels": False, "compiled_arches": [], "pure_python": True},
    }


def raw_wheel(folder: Path, tag: str = "py3-none-any", extra: dict[str, Member] | None = None) -> Path:
    """A wheel shaped like setup.py's Triton build (the real one is built in tests/integration)."""
    dist_info = f"flash_attn-2.8.3+{BUILT_LOCAL}.dist-info"
    purelib = "true" if tag == "py3-none-any" else "false"
    members = {
        "flash_attn/__init__.py": Member(b"__version__ = '2.8.3'\n"),
        "flash_attn/flash_attn_triton_amd/__init__.py": Member(b""),
        f"{dist_info}/METADATA": Member(
            f"Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3+{BUILT_LOCAL}\n"
            "Requires-Dist: torch\nRequires-Dist: einops\n\n".encode()
        ),
        f"{dist_info}/WHEEL": Member(
            f"Wheel-Version: 1.0\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n".encode()
        ),
        f"{dist_info}/top_level.txt": Member(b"flash_attn\n"),
        **(extra or {}),
    }
    wheel = write_wheel(folder, f"flash_attn-2.8.3+{BUILT_LOCAL}-{tag}.whl", dist_info, members, 1700000000)
    manifest_path_for(wheel).write_text(json.dumps(manifest(wheel.name)))
    return wheel


def test_names_of_a_triton_manifest() -> None:
    names = expected_names(manifest("x.whl"))
    assert names.pure_python and names.wheel_tag == "py3-none-any"
    assert names.version == f"2.8.3+{LOCAL}" and names.torch_requirement == "torch==2.9.*"
    legacy = manifest("x.whl")
    del legacy["inputs"]["rocm_backend"]  # the `rocm` block alone also says so
    assert expected_names(legacy).pure_python
    ck = manifest("x.whl", profile="ck", rocm_backend="ck")
    del ck["rocm"]
    ck["local_version"] = "rocm6.4torch2.9cxx11abiTRUE.ck"
    assert expected_names(ck).wheel_tag == "cp312-cp312-linux_x86_64"


def test_finalize_keeps_py3_none_any_and_skips_auditwheel(tmp_path: Path) -> None:
    raw = raw_wheel(tmp_path / "raw")
    res = finalize(raw, out_dir=tmp_path / "out")
    assert res.wheel.name == f"flash_attn-2.8.3+{LOCAL}-py3-none-any.whl"
    assert res.platform_tag == "any" and res.platform_reason == PURE_REASON
    data = json.loads(res.manifest.read_text())
    assert data["finalize"]["checks"] == ["record", "metadata", "pure-python", "check-wheel-contents"]
    assert data["finalize"]["torch_requirement"] == "torch==2.9.*" and data["finalize"]["excluded_libs"] == []
    assert data["platform_tag"] == {"tag": "any", "reason": PURE_REASON}
    assert data["rocm"]["ck_kernels"] is False
    with zipfile.ZipFile(res.wheel) as zf:
        dist_info = f"flash_attn-2.8.3+{LOCAL}.dist-info"
        meta = zf.read(f"{dist_info}/METADATA").decode()
        wheel_file = zf.read(f"{dist_info}/WHEEL").decode()
        record = json.loads(zf.read(f"{dist_info}/attnforge_build.json"))
    assert "Requires-Dist: torch==2.9.*" in meta and "Requires-Dist: einops" in meta
    assert f"Version: 2.8.3+{LOCAL}" in meta
    assert "Tag: py3-none-any" in wheel_file and "Root-Is-Purelib: true" in wheel_file
    assert record["platform_tag"] == "any" and record["rocm"]["rocm_backend"] == "triton"
    assert verify(res.wheel) == []


def test_a_compiled_wheel_for_a_triton_cell_is_refused(tmp_path: Path) -> None:
    raw = raw_wheel(tmp_path, tag="cp312-cp312-linux_x86_64")
    with pytest.raises(BuildError, match="must be py3-none-any"):
        finalize(raw, out_dir=tmp_path / "out")


def test_a_pure_tag_with_compiled_code_is_refused(tmp_path: Path) -> None:
    raw = raw_wheel(tmp_path, extra={"flash_attn_2_cuda.so": Member(b"\x7fELF", executable=True)})
    with pytest.raises(BuildError, match="compiled files in a pure wheel: flash_attn_2_cuda.so"):
        finalize(raw, out_dir=tmp_path / "out")


def test_a_pure_wheel_for_a_cuda_cell_is_refused(tmp_path: Path) -> None:
    raw = raw_wheel(tmp_path)
    data = manifest(raw.name, toolkit="cuda13.0", torch_variant="cu130", profile="full")
    for key in ("rocm", "local_version", "variant"):
        data.pop(key)
    del data["inputs"]["rocm_backend"]
    manifest_path_for(raw).write_text(json.dumps(data))
    with pytest.raises(BuildError, match="Python tag py3 but the cell is cp312"):
        finalize(raw, out_dir=tmp_path / "out")
