"""FlashAttention-2 on torch's stable ABI (a target's `abi: stable`): rule `stable-abi` with the shipped compat
data, names (cu130sm90torch2.10abi3.hd128, cp310-abi3, torch>=2.10), the kernel-set key shared with the
per-torch cells, the plan's one wheel per toolkit x arches x profile, the committed `fa2-stable` target, the
builder spec, and `which`/`doctor` on a published wheel (mirrors test_fa3_plan.py / test_fa3_which.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.client.doctor import diagnose
from attnforge.client.which import resolve
from attnforge.engine.environment import Env
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import CompatData, load_compat
from attnforge.matrix.file import parse_matrix
from attnforge.matrix.plan import plan_target
from attnforge.matrix.rules import check
from attnforge.matrix.schema import ProfileSpec
from attnforge.publish.index import Bundle, StaticIndex
from attnforge.wheels.naming import expected_names, parse_local, torch_pin
from attnforge.wheels.wheelio import Member, write_wheel
from tests.unit.test_wheels_resolver import probe

Run = Callable[..., tuple[int, str, str]]
FA_SHA = "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"
HD128 = ProfileSpec(head_dims=[128])
LOCAL = "cu130sm90torch2.10abi3.hd128"


@pytest.fixture(scope="module")
def data() -> CompatData:
    return load_compat()


def fa2(**kw: object) -> Cell:
    base: dict[str, object] = dict(
        kernel="flash-attn",
        kernel_version="2.8.3",
        toolkit=Toolkit.parse("cuda13.0"),
        torch="2.11.0",
        python="3.12",
        cxx11_abi=True,
        arches=("sm_90",),
        profile="hd128",
        profile_spec=HD128,
        source_sha256=FA_SHA,
        abi_request="stable",
    )
    base.update(kw)
    return Cell(**base)  # type: ignore[arg-type]


def test_abi_stable_makes_an_fa2_cell_one_abi3_wheel(data: CompatData) -> None:
    v = check(fa2(), data)
    assert v.valid, v.reasons()
    c = v.cell
    assert (c.torch_floor, c.abi3_python, c.stable_abi) == ("2.10", "3.10", True)
    assert c.patches == ("stable-abi", "torch-free-kernels")
    assert c.variant == "cu130-sm90-torch2.10abi3"
    assert c.local_version == LOCAL
    assert c.wheel_name == f"flash_attn-2.8.3+{LOCAL}-cp310-abi3-linux_x86_64.whl"
    assert torch_pin(c) == "torch>=2.10"
    assert any("stable ABI (patch 'stable-abi')" in n for n in v.notes)
    # torch 2.14 needs C++20 of full-API bindings; the stable binding includes only stable headers: no cxx20
    v14 = check(fa2(torch="2.14.1"), data)
    assert v14.valid and v14.cell.patches == ("stable-abi", "torch-free-kernels")
    assert any("stable headers" in n for n in v14.notes)


def test_the_stable_cell_links_the_per_torch_cells_kernel_objects(data: CompatData) -> None:
    stable = check(fa2(), data).cell
    per_torch = check(fa2(abi_request="torch", torch="2.14.1", python="3.11"), data).cell
    assert not per_torch.stable_abi and "cxx20-binding" in per_torch.patches
    assert stable.kernel_set_key == per_torch.kernel_set_key  # torch-free kernels, binding patches left out
    assert stable.torch_kernel_set_key != per_torch.torch_kernel_set_key


@pytest.mark.parametrize(
    ("kw", "note"),
    [
        ({"torch": "2.9.1"}, "torch 2.9 is older than flash-attn 2.8.3's stable-ABI floor 2.10"),
        ({"kernel_version": "2.7.4.post1"}, "flash-attn 2.7.4.post1 has no stable-ABI binding"),
        (
            {"toolkit": Toolkit.parse("rocm6.4"), "torch": "2.8.0", "arches": ("gfx942",)},
            "the stable-ABI binding is CUDA only",
        ),
    ],
)
def test_where_abi_stable_keeps_the_per_torch_binding(
    data: CompatData, kw: dict[str, object], note: str
) -> None:
    v = check(fa2(**kw), data)
    assert v.valid, v.reasons()
    assert not v.cell.stable_abi and "stable-abi" not in v.cell.patches
    assert any(note in n for n in v.notes), v.notes


def test_without_abi_stable_nothing_changes(data: CompatData) -> None:
    c = check(fa2(abi_request="torch"), data).cell
    assert not c.stable_abi and c.local_version == "cu130torch2.11cxx11abiTRUE.hd128"


MATRIX = f"""\
version: 1
kernels:
  flash-attn: {{version: "2.8.3", source: {{sha256: "{FA_SHA}"}}}}
profiles:
  full: {{}}
  hd128: {{head_dims: [128]}}
defaults: {{kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: hd128}}
targets:
  t:
    abi: stable
    matrix: {{toolkit: [cuda13.0], torch: ["2.9", "2.10", "2.11", "2.14"], python: ["3.11", "3.12"], arch: [sm_90]}}
"""


def test_plan_has_one_stable_wheel_and_per_torch_wheels_below_the_floor(data: CompatData) -> None:
    p = plan_target(parse_matrix(MATRIX), "t", data)
    s = p.summary()
    assert s["cells"] == 8 and s["invalid"] == 0
    assert s["wheels"] == 3 and s["served_by_another_wheel"] == 5  # one abi3 wheel + torch 2.9 x 2 Pythons
    assert s["variants"] == ["cu130-sm90-torch2.10abi3", "cu130-torch2.9"]
    [builder] = [c for c in p.valid if c.stable_abi]
    assert builder.wheel_name == f"flash_attn-2.8.3+{LOCAL}-cp310-abi3-linux_x86_64.whl"
    [shared] = p.shared_kernels()  # torch-free kernel units: one kernel set for both bindings
    assert len(shared.cells) == 3
    assert "shared by torch 2.9 x Python 3.11-3.12; also the stable-ABI wheel for torch >= 2.10" in shared.why
    below = [v for v in p.verdicts if v.cell.torch_family == "2.9"]
    assert all(
        any("older than flash-attn 2.8.3's stable-ABI floor 2.10" in n for n in v.notes) for v in below
    )


def test_the_committed_fa2_stable_target(run_cli: Run, root: Path) -> None:
    code, out, _ = run_cli(
        "--matrix", str(root / "matrix.yaml"), "plan", "-t", "fa2-stable", "--format", "json"
    )
    assert code == 0
    cells = json.loads(out)["cells"]
    assert [(c["wheel"], c["torch_floor"], c["valid"]) for c in cells] == [
        (f"flash_attn-2.8.3+{LOCAL}-cp310-abi3-linux_x86_64.whl", "2.10", True)
    ]
    assert "stable-abi" in cells[0]["patches"]


def test_the_builder_spec_of_a_stable_cell_asks_for_the_abi_check(data: CompatData, tmp_path: Path) -> None:
    from attnforge.builder.patches import resolve_patches
    from attnforge.builder.settings import BuildSettings
    from attnforge.builder.spec import Source
    from attnforge.engine.jobs import make_spec

    cell = check(fa2(), data).cell
    par = BuildSettings(2, 1, 4.5, "test")
    spec = make_spec(
        cell,
        source=Source("/s.tar.gz", FA_SHA),
        workdir=tmp_path / "cells" / "k" / "w",
        objects_dir=tmp_path / "o",
        ccache_dir=tmp_path / "c",
        settings=par,
    )
    assert spec.stable_abi and spec.local_version == LOCAL
    names = resolve_patches(spec)
    assert (
        names.index("torch-free-kernels") < names.index("stable-abi") < names.index("dispatch-subset-stable")
    )


INPUTS = {
    "toolkit": "cuda13.0",
    "torch": "2.11.0",
    "python": "3.12",
    "cxx11_abi": True,
    "arches": ["sm_90"],
    "profile": "hd128",
    "torch_floor": "2.10",
    "abi3_python": "3.10",
}
HOPPER = {"name": "H100", "capability": [9, 0], "gcn_arch": None}


def test_names_from_a_manifest() -> None:
    manifest = {"kernel": "flash-attn", "kernel_version": "2.8.3", "local_version": LOCAL, "inputs": INPUTS}
    names = expected_names(manifest)
    assert names.dist == "flash_attn" and names.version == f"2.8.3+{LOCAL}"
    assert names.wheel_tag == "cp310-abi3-linux_x86_64" and names.torch_requirement == "torch>=2.10"
    parts = parse_local(LOCAL)
    assert parts is not None and parts.stable_abi and parts.profile_tag == "hd128"
    assert parts.torch_problem("2.10.0") is None and "torch >= 2.10" in (parts.torch_problem("2.9.1") or "")


@pytest.fixture
def index(tmp_path: Path) -> Path:
    version = f"2.8.3+{LOCAL}"
    dist_info = f"flash_attn-{version}.dist-info"
    name = f"flash_attn-{version}-cp310-abi3-manylinux_2_34_x86_64.whl"
    members = {
        "flash_attn/__init__.py": Member(b"x = 1\n"),
        f"{dist_info}/METADATA": Member(
            f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\nRequires-Python: >=3.10\n"
            "Requires-Dist: torch>=2.10\n\n".encode()
        ),
        f"{dist_info}/WHEEL": Member(
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp310-abi3-manylinux_2_34_x86_64\n"
        ),
    }
    wheel = write_wheel(tmp_path / "in", name, dist_info, members, 1700000000)
    blob = wheel.read_bytes()
    manifest = {
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "variant": "cu130-sm90-torch2.10abi3",
        "wheel": name,
        "sha256": hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
        "inputs": dict(INPUTS),
        "finalize": {},
    }
    StaticIndex(tmp_path / "index").publish([Bundle(wheel=wheel, manifest=manifest)])
    return tmp_path / "index"


@pytest.mark.parametrize(
    ("torch", "cuda", "python"),
    [("2.10.0+cu130", "13.0", "3.10.4"), ("2.11.0+cu130", "13.0", "3.12.3"), ("2.15.0", "13.2", "3.13.1")],
)
def test_which_one_wheel_fits_every_torch_from_2_10(index: Path, torch: str, cuda: str, python: str) -> None:
    env = Env.from_probe(probe(torch=torch, cuda=cuda, python=python, gpus=[HOPPER]))
    res = resolve(env, str(index), "hd128", "flash-attn")
    assert res.choice is not None, res.explanation
    assert res.command == (
        f"pip install flash-attn==2.8.3+{LOCAL} --index-url {index.as_uri()}/cu130-sm90-torch2.10abi3/simple"
    )


def test_which_refuses_a_torch_below_the_floor(index: Path) -> None:
    res = resolve(Env.from_probe(probe(torch="2.9.1+cu130", cuda="13.0")), str(index), "hd128", "flash-attn")
    assert res.choice is None
    assert next(iter(res.to_json()["rejected"].values()))["torch"] == (
        "wheel needs torch >= 2.10 (stable ABI), this is 2.9.1+cu130"
    )


def test_doctor_on_an_installed_stable_fa2_wheel() -> None:
    record = {"cell_id": "c", "variant": "cu130-sm90-torch2.10abi3", "inputs": dict(INPUTS)}
    data = probe(torch="2.13.0+cu131", cuda="13.1", gpus=[HOPPER], python="3.11.7")
    data["flash_attn"] = {
        "installed": True,
        "version": f"2.8.3+{LOCAL}",
        "requires": ["torch>=2.10", "einops"],
        "location": "/v",
        "build_record": record,
        "import": {"ok": True, "file": "/v/flash_attn/__init__.py"},
    }
    checks = {c.name: (c.status, c.detail) for c in diagnose(data, "flash-attn")}
    assert all(status in ("ok", "skip") for status, _ in checks.values()), checks
    assert (
        checks["torch release"][1] == "stable-ABI wheel for torch >= 2.10 (built with 2.11.0), running 2.13"
    )
    assert checks["python"][1] == "abi3 wheel for Python >= 3.10, running 3.11"
