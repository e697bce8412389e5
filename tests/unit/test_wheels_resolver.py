"""`which` (matching an environment to an index's wheels) and `doctor` (diagnosing an installed wheel)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest

from attnforge.client.doctor import diagnose
from attnforge.client.which import resolve
from attnforge.core.arches import arch_runs_on
from attnforge.engine.environment import Env, interpreter_abis, run_probe
from attnforge.publish.index import Bundle, StaticIndex
from attnforge.wheels.wheelio import Member, write_wheel
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


TRITON_LOCAL = "rocm6.4torch2.9cxx11abiTRUE.triton"


def pure_bundle(where: Path, tag: str) -> Bundle:
    """A pure-Python ROCm Triton wheel as the triton backend names it (`...-py3-none-any.whl`)."""
    version = f"2.8.3+{TRITON_LOCAL}"
    dist_info = f"flash_attn-{version}.dist-info"
    name = f"flash_attn-{version}-{tag}.whl"
    members = {
        "flash_attn/__init__.py": Member(b"x = 1\n"),
        f"{dist_info}/METADATA": Member(
            f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\nRequires-Python: >=3.9\n"
            "Requires-Dist: torch==2.9.*\n\n".encode()
        ),
        f"{dist_info}/WHEEL": Member(f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()),
    }
    wheel = write_wheel(where, name, dist_info, members, 1700000000)
    data = wheel.read_bytes()
    manifest = {
        "kernel_version": "2.8.3",
        "variant": "rocm6.4-torch2.9",
        "wheel": name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "inputs": {
            "toolkit": "rocm6.4",
            "torch": "2.9.1",
            "python": "3.12",
            "cxx11_abi": True,
            "arches": ["gfx90a", "gfx942"],
        },
        "finalize": {},
    }
    return Bundle(wheel=wheel, manifest=manifest)


def rocm_probe(python: str, gpus: list[Any] | None = None) -> dict[str, Any]:
    data = probe(torch="2.9.1+rocm6.4", cuda=None, gpus=gpus, python=python)
    data["torch"]["hip"] = "6.4.43484-123"
    return data


@pytest.mark.parametrize("tag", ["py3-none-any", "py39-none-any", "py2.py3-none-any"])
@pytest.mark.parametrize("python", ["3.10.4", "3.11.7", "3.12.1", "3.13.0"])
def test_pure_python_wheel_fits_every_cpython_3(tmp_path: Path, tag: str, python: str) -> None:
    """pip installs a `py3-none-any` wheel on any CPython 3 (and `py39` on 3.9 and later): so does `which`."""
    StaticIndex(tmp_path / "index").publish([pure_bundle(tmp_path / "in", tag)])
    gfx942 = {"name": "MI300X", "capability": [9, 4], "gcn_arch": "gfx942:sramecc+:xnack-"}
    for gpus in (None, [gfx942]):
        res = resolve(Env.from_probe(rocm_probe(python, gpus)), str(tmp_path / "index"), profile="triton")
        rejected = res.to_json()["rejected"]
        assert res.choice is not None, rejected
        assert res.choice.filename == f"flash_attn-2.8.3+{TRITON_LOCAL}-{tag}.whl"
        assert res.command == (
            f"pip install flash-attn==2.8.3+{TRITON_LOCAL} "
            f"--index-url {(tmp_path / 'index').as_uri()}/rocm6.4-torch2.9/simple"
        )


@pytest.mark.parametrize(
    ("tag", "python", "why"),
    [
        ("py313-none-any", "3.12.1", "wheel is for py313, this is cp312"),  # py3X: X and later only
        ("cp312-cp312-any", "3.11.7", "wheel is for cp312, this is cp311"),
        ("py3-cp312-any", "3.12.1", "wheel is for py3 with ABI cp312, this is cp312"),  # an ABI needs its cp
        ("py2-none-any", "3.12.1", "wheel is for py2, this is cp312"),
    ],
)
def test_pure_python_wheel_mismatches(tmp_path: Path, tag: str, python: str, why: str) -> None:
    StaticIndex(tmp_path / "index").publish([pure_bundle(tmp_path / "in", tag)])
    res = resolve(Env.from_probe(rocm_probe(python)), str(tmp_path / "index"), profile="triton")
    assert res.choice is None
    assert res.to_json()["rejected"] == {f"flash_attn-2.8.3+{TRITON_LOCAL}-{tag}.whl": {"python": why}}


def test_interpreter_abis_are_pips() -> None:
    pairs = interpreter_abis("3.11")
    for ok in [
        ("cp311", "cp311"),
        ("cp311", "abi3"),
        ("cp39", "abi3"),
        ("cp311", "none"),
        ("py311", "none"),
        ("py3", "none"),
        ("py39", "none"),
        ("py30", "none"),
    ]:
        assert ok in pairs, ok
    for no in [
        ("cp312", "cp312"),
        ("cp312", "abi3"),
        ("py312", "none"),
        ("py3", "cp311"),
        ("py2", "none"),
        ("cp310", "cp310"),
        ("pp311", "pypy311_pp73"),
    ]:
        assert no not in pairs, no


def test_an_any_wheel_is_platform_neutral_but_a_linux_one_is_not(tmp_path: Path) -> None:
    StaticIndex(tmp_path / "index").publish([pure_bundle(tmp_path / "in", "py3-none-linux_aarch64")])
    res = resolve(Env.from_probe(rocm_probe("3.12.1")), str(tmp_path / "index"), profile="triton")
    assert res.choice is None
    assert res.to_json()["rejected"] == {
        f"flash_attn-2.8.3+{TRITON_LOCAL}-py3-none-linux_aarch64.whl": {
            "platform": "wheel is linux_aarch64, this is x86_64 glibc 2.36"
        }
    }


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
