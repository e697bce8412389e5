"""Python 3.14, the free-threaded 3.14t, aarch64 cells and the arch policy, with the shipped compat data and the
repository's matrix: names and tags, rules and their reasons, kernel-set keys, the builder's gencode and cross
pieces, `which`'s tags, and the generated workflows' runners (no build: seconds)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnforge.builder.patches import PATCHES_DIR
from attnforge.ci.workflow_spec import CiSettings
from attnforge.ci.workflows import render
from attnforge.ci.yamltext import load
from attnforge.engine.environment import interpreter_abis
from attnforge.matrix.arch_policy import cell_targets, compiled_targets
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import CompatData, load_compat
from attnforge.matrix.project import Project
from attnforge.matrix.rules import check
from attnforge.matrix.schema import ProfileSpec

ROOT = Path(__file__).resolve().parents[2]
FWD128 = ProfileSpec(
    tag="fwd128",
    head_dims=[128],
    dtypes=["bf16"],
    disable=["backward", "dropout", "alibi", "softcap", "uneven_k", "local"],
)


@pytest.fixture(scope="module")
def data() -> CompatData:
    return load_compat()


@pytest.fixture(scope="module")
def project() -> Project:
    return Project(ROOT / "matrix.yaml")


def fa2(**kw: object) -> Cell:
    base: dict[str, object] = dict(
        kernel="flash-attn",
        kernel_version="2.8.3",
        toolkit=Toolkit.parse("cuda13.0"),
        torch="2.14.1",
        python="3.11",
        cxx11_abi=True,
        arches=("sm_90",),
        profile="fwd128",
        profile_spec=FWD128,
        source_sha256="1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d",
    )
    base.update(kw)
    return Cell(**base)  # type: ignore[arg-type]


def test_free_threaded_cell_is_its_own_abi(data: CompatData) -> None:
    v = check(fa2(python="3.14t"), data)
    assert v.valid, v.reasons()
    c = v.cell
    assert c.free_threaded and c.cp == "cp314t" and c.interpreter_tag == "cp314"
    assert c.wheel_tag == "cp314-cp314t-linux_x86_64"
    assert "-cp314t-" in c.id and c.binding_slug.startswith("cp314t-")
    # Python never enters the kernel-set key: 3.11, 3.14 and 3.14t share the lane's kernel objects
    keys = {check(fa2(python=p), data).cell.kernel_set_key for p in ("3.11", "3.14", "3.14t")}
    assert len(keys) == 1


def test_free_threaded_refused_where_torch_ships_none(data: CompatData) -> None:
    # torch 2.12+ dropped cp313t (2.7-2.11 shipped it), so 3.13t is refused there, naming what it ships
    v = check(fa2(python="3.13t"), data)
    assert not v.valid
    (reason,) = [r for r in v.reasons() if r.startswith("[torch-python]")]
    assert "free-threaded" in reason and "cp313t" in reason and "3.14t" in reason
    assert check(fa2(torch="2.8.0", toolkit=Toolkit.parse("cuda12.8"), python="3.13t"), data).valid


def test_abi_stable_keeps_a_per_torch_wheel_for_free_threaded(data: CompatData) -> None:
    stable = check(fa2(python="3.14", abi_request="stable"), data)
    assert stable.valid and stable.cell.stable_abi and stable.cell.wheel_tag == "cp310-abi3-linux_x86_64"
    ft = check(fa2(python="3.14t", abi_request="stable"), data)
    assert ft.valid and not ft.cell.stable_abi
    assert ft.cell.wheel_tag == "cp314-cp314t-linux_x86_64"
    assert any("free-threaded" in n and "per-torch cp314t" in n for n in ft.notes)


def test_fa3_refuses_free_threaded(data: CompatData) -> None:
    cell = fa2(kernel="flash-attn-3", kernel_version="3.0.0", arches=("sm_90a",), python="3.14t")
    cell = replace(cell, profile="fa3min", profile_spec=ProfileSpec(head_dims=[64], dtypes=["bf16"]))
    v = check(cell, data)
    assert any(r.startswith("[stable-abi]") and "free-threaded" in r for r in v.reasons())


def test_aarch64_cell_has_its_own_key_and_tag(data: CompatData) -> None:
    x86 = check(fa2(python="3.12"), data)
    arm = check(fa2(python="3.12", platform="aarch64"), data)
    assert arm.valid, arm.reasons()
    assert arm.cell.wheel_tag == "cp312-cp312-linux_aarch64"
    assert arm.cell.kernel_set_key != x86.cell.kernel_set_key  # host stubs are aarch64 code
    old = check(
        fa2(torch="2.6.0", toolkit=Toolkit.parse("cuda12.4"), python="3.12", platform="aarch64"), data
    )
    assert any("aarch64" in r for r in old.reasons())


def test_arch_policy_family_targets_and_ptx(data: CompatData) -> None:
    wide = ("sm_80", "sm_90", "sm_100", "sm_120")
    t = compiled_targets("flash-attn", "13.0", wide, data)
    assert t.gencode == (
        "arch=compute_80,code=sm_80",
        "arch=compute_90,code=sm_90",
        "arch=compute_100f,code=sm_100",
        "arch=compute_120f,code=sm_120",
        "arch=compute_120,code=compute_120",
    )
    assert t.runs_on("sm_103") == "native" and t.runs_on("sm_121") == "native"
    assert t.runs_on("sm_89") == "native" and t.runs_on("sm_75") is None
    old = compiled_targets("flash-attn", "12.8", wide, data)
    assert old.gencode == tuple(f"arch=compute_{a[3:]},code={a}" for a in wide) and not old.ptx
    assert compiled_targets("flash-attn-3", "13.0", ("sm_90a",), data).gencode == ()
    # the default lane: sm_90 SASS plus its PTX, which newer GPUs JIT-compile
    v = check(fa2(), data)
    assert v.cell.gencode == ("arch=compute_90,code=sm_90", "arch=compute_90,code=compute_90")
    targets = cell_targets(v.cell.arches, v.cell.gencode)
    assert targets.runs_on("sm_90") == "native" and targets.runs_on("sm_100") == "ptx"
    assert targets.runs_on("sm_80") is None


def test_setup_hook_replaces_gencode() -> None:
    sys.path.insert(0, str(PATCHES_DIR))
    try:
        import setup_hook
    finally:
        sys.path.pop(0)
    args = [
        "-O3",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "--threads",
        "4",
        "-gencode=arch=compute_80,code=sm_80",
    ]
    out = setup_hook.replace_gencode(args, ["arch=compute_100f,code=sm_100"])
    assert out == ["-O3", "--threads", "4", "-gencode", "arch=compute_100f,code=sm_100"]


def test_free_threaded_tags_exclude_abi3() -> None:
    ft = interpreter_abis("3.14t")
    assert ("cp314", "cp314t") in ft and ("cp314", "abi3") not in ft and ("cp310", "abi3") not in ft
    assert ("cp314", "cp314") not in ft
    gil = interpreter_abis("3.14")
    assert ("cp314", "cp314") in gil and ("cp310", "abi3") in gil and ("cp314", "cp314t") not in gil


def test_release_plan_lists_py314_and_aarch64(project: Project) -> None:
    plan = project.plan("release")
    by_id = {v.cell.id: v for v in plan.verdicts}
    ft = [v for v in plan.verdicts if v.cell.python == "3.14t"]
    assert ft and any(v.valid for v in ft) and any(not v.valid for v in ft)
    assert any(any("free-threaded" in r for r in v.reasons()) for v in ft if not v.valid)
    assert all(not v.cell.stable_abi and v.served_by is None for v in ft if v.valid)
    arm = [v for v in plan.verdicts if v.cell.platform == "aarch64"]
    assert arm and all(v.cell.wheel_tag.endswith("linux_aarch64") for v in arm if v.valid)
    assert any(v.valid for v in arm), [v.reasons() for v in arm]
    assert len(by_id) == len(plan.verdicts)


def test_py314_target_shares_the_default_lane(project: Project) -> None:
    default = project.plan("default").valid
    py314 = project.plan("py314").valid
    assert {c.python for c in py314} == {"3.14", "3.14t"}
    assert {c.kernel_set_key for c in py314} == {default[0].kernel_set_key}
    arm = project.plan("aarch64").valid
    assert {c.platform for c in arm} == {"aarch64"} and {c.python for c in arm} == {"3.11", "3.12"}
    assert len({c.kernel_set_key for c in arm}) == 1 and arm[0].kernel_set_key != default[0].kernel_set_key


def test_release_workflow_runs_aarch64_on_arm64(project: Project) -> None:
    files = render(project, {"release": "release"}, CiSettings())
    jobs = load(files["attnforge-release.yml"])["jobs"]
    arm = [j for j in jobs.values() if isinstance(j, dict) and j.get("runs-on") == "ubuntu-24.04-arm"]
    assert arm
    ft = [
        j
        for j in jobs.values()
        if isinstance(j, dict)
        and any("3.14t" in str((s.get("with") or {}).get("python-version", "")) for s in j.get("steps", []))
    ]
    assert ft
    arm_parity = [j for j in jobs.values() if isinstance(j, dict) and "arm64" in (j.get("runs-on") or [])]
    assert all("gpu" in j["runs-on"] for j in arm_parity)


def test_cross_pieces_of_the_builder() -> None:
    from attnforge.builder.cross import PIP_PLATFORMS, host_machine, is_cross, target_requirements
    from attnforge.builder.spec import BuildSpec, Source

    spec = BuildSpec(
        cell_id="c",
        kernel="flash-attn",
        kernel_version="2.8.3",
        source=Source("/s.tar.gz", "0" * 64),
        python="3.12",
        torch="2.14.1",
        torch_variant="cu130",
        build_dir="/b",
        venv_dir="/v",
        output_dir="/o",
        platform="aarch64" if host_machine() == "x86_64" else "x86_64",
    )
    assert is_cross(spec) and not is_cross(spec.replace(platform=host_machine()))
    assert target_requirements(spec) == ["torch==2.14.1", "nvidia-cuda-runtime==13.0.*"]
    assert "manylinux2014_aarch64" in PIP_PLATFORMS["aarch64"]  # NVIDIA's wheels; torch's are manylinux_2_28


def test_setup_hook_points_an_extension_at_the_target_torch() -> None:
    sys.path.insert(0, str(PATCHES_DIR))
    try:
        import setup_hook
    finally:
        sys.path.pop(0)

    ext = SimpleNamespace(
        include_dirs=[Path("/v/lib/torch/include"), "/src/csrc", "/usr/local/cuda/include"],
        library_dirs=["/v/lib/torch/lib", "/usr/local/cuda/lib64"],
    )
    setup_hook.cross_paths(
        ext, "/v/lib/torch", "/t/site/torch", ["/t/site/torch/lib", "/t/site/nvidia/cu13/lib"]
    )
    assert ext.include_dirs == ["/t/site/torch/include", "/src/csrc", "/usr/local/cuda/include"]
    assert ext.library_dirs == ["/t/site/torch/lib", "/t/site/nvidia/cu13/lib", "/usr/local/cuda/lib64"]
