"""`which` (matching an environment to an index's wheels) and `doctor` (diagnosing an installed wheel)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from attnforge.wheels.doctor import diagnose
from attnforge.wheels.index import StaticIndex
from attnforge.wheels.resolver import Env, arch_runs_on, resolve, run_probe
from tests.unit.test_wheels_index import make_bundle


def probe(
    torch: str | None = "2.14.1+cu130", cuda: str | None = "13.0", gpus: list[Any] | None = None, **kw: Any
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "executable": "/venv/bin/python",
        "python": "3.11.7",
        "machine": "x86_64",
        "glibc": "2.36",
        "driver": None,
        "torch": {
            "installed": torch is not None,
            "version": torch,
            "cuda": cuda,
            "hip": None,
            "cxx11_abi": True,
            "gpus": gpus or [],
        },
    }
    data.update(kw)
    return data


@pytest.fixture
def index(tmp_path: Path) -> Path:
    bundles = [
        make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE", plat="manylinux_2_34_x86_64"),
        make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE.infer", plat="manylinux_2_34_x86_64"),
        make_bundle(tmp_path / "in", "cu128torch2.8cxx11abiTRUE"),
    ]
    for b in bundles:
        b.manifest["inputs"]["arches"] = ["sm_80", "sm_90"]
        b.manifest["inputs"]["toolkit"] = "cuda" + ("13.0" if "cu130" in b.filename else "12.8")
    StaticIndex(tmp_path / "index").publish(bundles)
    return tmp_path / "index"


def test_fit_gives_the_variant_index_command(index: Path) -> None:
    res = resolve(Env.from_probe(probe()), str(index))
    assert res.choice is not None and res.choice.filename.startswith(
        "flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE-"
    )
    assert res.command == (
        f"pip install flash-attn==2.8.3+cu130torch2.14cxx11abiTRUE --index-url {index.as_uri()}/cu130-torch2.14/simple"
    )
    lean = resolve(Env.from_probe(probe()), str(index), profile="infer")
    assert lean.choice is not None and lean.choice.version.endswith(".infer")


def test_no_fit_names_the_axis_and_the_cell(index: Path) -> None:
    res = resolve(Env.from_probe(probe(torch="2.13.0+cu130")), str(index))
    assert res.choice is None
    text = "\n".join(res.explanation)
    assert "torch: wheel needs torch 2.14.*, this is 2.13.0+cu130" in text
    assert res.build_cell == "flash-attn-2.8.3-cu130-torch2.13.0-cp311-abi1-sm80-sm90-full-x86_64"
    assert f"attnforge build --cell {res.build_cell}" in text


def test_gpu_arch_and_driver_are_checked(index: Path) -> None:
    # torch on CUDA fills gcnArchName with the device name (seen on an H100, torch 2.11): not an arch
    hopper = {"name": "H100", "capability": [9, 0], "gcn_arch": "NVIDIA H100 80GB HBM3"}
    ada = {"name": "L4", "capability": [8, 9], "gcn_arch": None}
    blackwell = {"name": "B200", "capability": [10, 0], "gcn_arch": None}
    assert resolve(Env.from_probe(probe(gpus=[hopper])), str(index)).choice is not None
    assert (
        resolve(Env.from_probe(probe(gpus=[ada])), str(index)).choice is not None
    )  # sm_80 SASS runs on sm_89
    res = resolve(Env.from_probe(probe(gpus=[blackwell])), str(index))
    assert res.choice is None and "wheel has sm_80, sm_90, GPU here is sm_100" in "\n".join(res.explanation)
    assert res.build_cell is not None and "-sm100-full-" in res.build_cell
    old_driver = probe(gpus=[hopper], driver={"driver": "550.54", "cuda": "12.4"})
    res = resolve(Env.from_probe(old_driver), str(index))
    assert res.choice is None and "driver for CUDA 13.0" in "\n".join(res.explanation)


def test_cpu_torch_and_old_abi_and_python() -> None:
    env = Env.from_probe(probe(torch="2.14.1+cpu", cuda=None))
    assert env.accel is None and "CPU-only" in env.describe()
    env = Env.from_probe(probe(python="3.12.1"))
    assert env.python_tag == "cp312"


@pytest.mark.parametrize(
    ("compiled", "device", "runs"),
    [
        ("sm_80", "sm_86", True),
        ("sm_80", "sm_89", True),
        ("sm_86", "sm_80", False),
        ("sm_90", "sm_100", False),
        ("sm_90a", "sm_90", True),
        ("sm_90a", "sm_100", False),
        ("gfx942", "gfx942", True),
        ("gfx90a", "gfx942", False),
    ],
)
def test_arch_compatibility(compiled: str, device: str, runs: bool) -> None:
    assert arch_runs_on(compiled, device) is runs


def test_probe_runs_in_an_interpreter_without_attnforge() -> None:
    data = run_probe(sys.executable)
    assert data["python"].startswith("3.") and data["machine"]
    assert data["torch"]["installed"] in (True, False)


def record(**inputs: Any) -> dict[str, Any]:
    base = {
        "toolkit": "cuda13.0",
        "torch": "2.14.1",
        "python": "3.11",
        "cxx11_abi": True,
        "arches": ["sm_90"],
    }
    return {"cell_id": "c", "variant": "cu130-torch2.14", "inputs": {**base, **inputs}}


def fa(rec: dict[str, Any] | None, ok: bool = True) -> dict[str, Any]:
    imp = (
        {"ok": True, "file": "/x.so"}
        if ok
        else {"ok": False, "error": "ImportError: undefined symbol: _ZN3c10"}
    )
    return {
        "installed": True,
        "version": "2.8.3+cu130torch2.14cxx11abiTRUE",
        "location": "/site",
        "requires": ["torch==2.14.*"],
        "build_record": rec,
        "import": imp,
    }


def statuses(checks: list[Any]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def test_doctor_all_good_without_gpu() -> None:
    s = statuses(diagnose(probe(flash_attn=fa(record()))))
    assert s["torch requirement"] == s["C++ ABI"] == s["import flash_attn_2_cuda"] == "ok"
    assert s["GPU arch"] == "skip"


def test_doctor_finds_every_mismatch() -> None:
    data = probe(
        torch="2.13.0+cu128",
        cuda="12.8",
        gpus=[{"name": "B200", "capability": [10, 0], "gcn_arch": None}],
        driver={"driver": "550", "cuda": "12.4"},
        flash_attn=fa(record(), ok=False),
    )
    data["torch"]["cxx11_abi"] = False
    s = statuses(diagnose(data))
    for name in (
        "torch requirement",
        "torch release",
        "accelerator",
        "C++ ABI",
        "import flash_attn_2_cuda",
        "GPU arch",
        "driver",
    ):
        assert s[name] == "fail", name
    hint = next(c.detail for c in diagnose(data) if c.name == "import flash_attn_2_cuda")
    assert "compiled against another torch build" in hint


def test_doctor_without_flash_attn_or_record() -> None:
    assert statuses(diagnose(probe(flash_attn={"installed": False}))) == {"flash-attn": "fail"}
    s = statuses(diagnose(probe(flash_attn=fa(None))))
    assert s["build record"] == "warn" and s["torch requirement"] == "ok"
