"""`which` and `doctor` with a stable-ABI flash-attn-3 wheel published to a real static index: any torch from its
floor on, a newer CUDA minor of its major, any CPython >= 3.10, either C++ ABI; sm_90a runs on an sm_90 GPU."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from attnforge.client.doctor import diagnose
from attnforge.client.which import resolve
from attnforge.engine.environment import Env
from attnforge.publish.index import Bundle, StaticIndex
from attnforge.wheels.wheelio import Member, write_wheel
from tests.unit.test_wheels_resolver import probe

LOCAL = "cu130sm90atorch2.9abi3.fa3hd64128"
INPUTS = {
    "toolkit": "cuda13.0",
    "torch": "2.11.0",
    "python": "3.12",
    "cxx11_abi": True,
    "arches": ["sm_90a"],
    "profile": "fa3hd64128",
    "torch_floor": "2.9",
    "abi3_python": "3.10",
}
HOPPER = {"name": "H100", "capability": [9, 0], "gcn_arch": None}


def fa3_bundle(where: Path) -> Bundle:
    version = f"3.0.0+{LOCAL}"
    dist_info = f"flash_attn_3-{version}.dist-info"
    name = f"flash_attn_3-{version}-cp310-abi3-manylinux_2_34_x86_64.whl"
    members = {
        "flash_attn_interface.py": Member(b"x = 1\n"),
        f"{dist_info}/METADATA": Member(
            f"Metadata-Version: 2.1\nName: flash_attn_3\nVersion: {version}\nRequires-Python: >=3.10\n"
            "Requires-Dist: torch>=2.9\n\n".encode()
        ),
        f"{dist_info}/WHEEL": Member(
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp310-abi3-manylinux_2_34_x86_64\n"
        ),
    }
    wheel = write_wheel(where, name, dist_info, members, 1700000000)
    data = wheel.read_bytes()
    manifest = {
        "kernel": "flash-attn-3",
        "kernel_version": "3.0.0",
        "variant": "cu130-sm90a-torch2.9abi3",
        "wheel": name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "inputs": dict(INPUTS),
        "finalize": {},
    }
    return Bundle(wheel=wheel, manifest=manifest)


@pytest.fixture
def index(tmp_path: Path) -> Path:
    StaticIndex(tmp_path / "index").publish([fa3_bundle(tmp_path / "in")])
    return tmp_path / "index"


@pytest.mark.parametrize(
    ("torch", "cuda", "python"),
    [
        ("2.11.0+cu130", "13.0", "3.12.3"),
        ("2.14.1", "13.0", "3.11.7"),
        ("2.9.1+cu130", "13.0", "3.10.4"),
        ("2.15.0", "13.2", "3.13.1"),
    ],
)
def test_one_wheel_fits_every_torch_from_its_floor(index: Path, torch: str, cuda: str, python: str) -> None:
    env = Env.from_probe(probe(torch=torch, cuda=cuda, python=python, gpus=[HOPPER]))
    res = resolve(env, str(index), "fa3hd64128", "flash-attn-3")
    assert res.choice is not None, res.explanation
    assert res.command == (
        f"pip install flash-attn-3==3.0.0+{LOCAL} --index-url {index.as_uri()}/cu130-sm90a-torch2.9abi3/simple"
    )


@pytest.mark.parametrize(
    ("kw", "axis", "why"),
    [
        (
            {"torch": "2.8.0+cu128", "cuda": "12.8"},
            "torch",
            "wheel needs torch >= 2.9 (stable ABI), this is 2.8.0+cu128",
        ),
        ({"torch": "2.9.1+cu128", "cuda": "12.8"}, "accelerator", "wheel is cu130, torch here is cu128"),
        ({"python": "3.9.18"}, "python", "wheel is for cp310, this is cp39"),
        (
            {"gpus": [{"name": "B200", "capability": [10, 0], "gcn_arch": None}]},
            "gpu_arch",
            "wheel has sm_90a, GPU here is sm_100",
        ),
    ],
)
def test_what_a_stable_abi_wheel_does_not_fit(index: Path, kw: dict[str, Any], axis: str, why: str) -> None:
    res = resolve(Env.from_probe(probe(**kw)), str(index), "fa3hd64128", "flash-attn-3")
    assert res.choice is None
    rejected = res.to_json()["rejected"]
    assert next(iter(rejected.values()))[axis] == why


def test_doctor_on_an_installed_fa3_wheel() -> None:
    record = {"cell_id": "c", "variant": "cu130-sm90a-torch2.9abi3", "inputs": dict(INPUTS)}
    fa = {
        "installed": True,
        "version": f"3.0.0+{LOCAL}",
        "requires": ["torch>=2.9", "einops"],
        "location": "/v",
        "build_record": record,
        "import": {"ok": True, "file": "/v/flash_attn_interface.py"},
    }
    data = probe(torch="2.13.0+cu131", cuda="13.1", gpus=[HOPPER], python="3.11.7")
    data["flash_attn"] = fa
    checks = {c.name: (c.status, c.detail) for c in diagnose(data, "flash-attn-3")}
    assert all(status in ("ok", "skip") for status, _ in checks.values()), checks
    assert checks["torch release"][1] == "stable-ABI wheel for torch >= 2.9 (built with 2.11.0), running 2.13"
    assert checks["python"][1] == "abi3 wheel for Python >= 3.10, running 3.11"
    assert checks["import flash_attn_interface"][0] == "ok" and checks["GPU arch"][0] == "ok"
    data["torch"]["version"], data["torch"]["cuda"] = "2.8.0+cu128", "12.8"
    bad = {c.name for c in diagnose(data, "flash-attn-3") if c.status == "fail"}
    assert bad == {"torch requirement", "torch release", "accelerator"}
