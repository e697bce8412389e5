"""One owner for every name (`attnforge.names`): every cell of every shipped target renders its names and
parses them back to the same parts; readers take the manifest's profile tag; the module needs nothing but the
standard library."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from attnforge import names
from attnforge.engine.rocm.build_plan import plan_rocm_build
from attnforge.images.requests import runtime_request
from attnforge.images.tags import ImageSpec, resolve_tags
from attnforge.matrix.cell import Cell
from attnforge.matrix.plan import Plan
from attnforge.matrix.project import Project
from attnforge.matrix.schema import ProfileSpec
from attnforge.parity import profile as parity_profile
from attnforge.wheels.manifest import manifest_inputs
from attnforge.wheels.naming import cell_from_manifest, expected_names

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PROJECT = Project(ROOT / "matrix.yaml")
TARGETS = sorted(PROJECT.matrix.targets)
PLANS: dict[str, Plan] = {}


def plan(target: str) -> Plan:
    if target not in PLANS:
        PLANS[target] = PROJECT.plan(target)
    return PLANS[target]


def manifest_of(cell: Cell, **inputs: Any) -> dict[str, Any]:
    """The manifest the build engine writes for a cell (its name fields and `inputs`; `wheel_record`)."""
    if cell.toolkit.kind == "rocm":  # the ROCm backend names the wheel's tag (py3-none-any for Triton)
        inputs = {"rocm_backend": plan_rocm_build(cell).backend, **inputs}
    return {
        "kernel": cell.kernel,
        "kernel_version": cell.kernel_version,
        "variant": cell.variant,
        "local_version": cell.local_version,
        "inputs": {**manifest_inputs(cell), **inputs},
    }


def without_tag(manifest: dict[str, Any]) -> dict[str, Any]:
    """The same manifest as written before `inputs.profile_tag` existed."""
    inputs = {k: v for k, v in manifest["inputs"].items() if k != "profile_tag"}
    return {**manifest, "inputs": inputs}


def image_of(cell: Cell) -> ImageSpec:
    return ImageSpec(
        kind="runtime",
        kernel=cell.kernel,
        kernel_version=cell.kernel_version,
        dist_version=f"{cell.kernel_version}+{cell.local_version}",
        variant=cell.variant,
        python=cell.python,
        toolkit=str(cell.toolkit),
        torch=cell.torch,
        arches=cell.arches,
        profile=cell.profile,
        profile_tag=cell.profile_tag,
    )


def test_every_shipped_target_is_planned() -> None:
    assert {"default", "release", "hopper", "fa2-stable", "fa4"} <= set(TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_every_cell_renders_and_parses_back_to_its_parts(target: str) -> None:
    verdicts = plan(target).verdicts
    for verdict in verdicts:
        cell = verdict.cell
        local = cell.local_version
        parts = names.parse_local(local)
        assert parts == cell.name_parts, f"{cell.id}: {local} parses to {parts}"
        assert (parts.variant, parts.local_version) == (cell.variant, local)
        assert names.parse_version(f"{cell.kernel_version}+{local}") == parts
        # the wheel file spells the same local version; PEP 440 readers see it lower-cased
        assert names.parse_local(cell.wheel_name.split("-")[1].partition("+")[2]) == parts
        assert names.parse_local(local.lower()) == parts
        assert names.profile_tag_of(local) == cell.profile_tag
        assert parity_profile.profile_tag(f"{cell.kernel_version}+{local}") == cell.profile_tag
        # toolkit spellings both ways
        assert names.toolkit_of_variant(cell.toolkit.short) == str(cell.toolkit)
        assert type(cell.toolkit)(*names.split_toolkit(str(cell.toolkit))) == cell.toolkit
        # the image tag: made from the names, parsed back to kernel, version, family and Python
        image = image_of(cell)
        assert names.parse_image_tag(image.tag) == {
            "kernel": cell.kernel,
            "version": cell.kernel_version,
            "family": names.image_family(cell.variant, cell.profile_tag),
            "py": cell.python,
        }
    valid = [v.cell for v in verdicts if v.valid]
    for cell in valid:  # the manifest carries every name input: a reader remakes the same names
        manifest = manifest_of(cell)
        assert manifest["inputs"]["profile_tag"] == cell.profile_tag
        for m in (manifest, without_tag(manifest)):  # ... also from a manifest older than profile_tag
            again = cell_from_manifest(m)
            assert (again.local_version, again.variant, again.wheel_tag) == (
                cell.local_version,
                cell.variant,
                cell.wheel_tag,
            )
            assert expected_names(m).local_version == cell.local_version


@pytest.mark.parametrize("target", [t for t in TARGETS if t == "fa4" or "fa4" in t])
def test_fa4_kernel_wheels_parse_back(target: str) -> None:
    fa4 = [v for v in plan(target).fa4 if v.valid and v.cell is not None]
    assert fa4, "the fa4 target plans FA4 cells"
    for v in fa4:
        assert v.cell is not None
        parts = names.parse_fa4_local(v.variant)
        assert parts is not None and (parts.cuda_major, parts.arch) == (v.cell.cuda_major, v.cell.arch)
        assert parts.local_version == v.variant and f"+{v.variant}-" in v.wheel
        assert names.parse_local(v.variant) is None and names.parse_flex_local(v.variant) is None


@pytest.mark.parametrize("family", ["default", "llama"])
def test_flex_kernel_wheels_parse_back(family: str) -> None:
    """Flex wheels are named by the environment their kernels were compiled in: every torch of the compat
    table, every CUDA toolkit of the shipped targets, Hopper and Blackwell, and the CPU."""
    torches = sorted({v.cell.torch for t in TARGETS for v in plan(t).verdicts})
    toolkits = sorted({str(v.cell.toolkit) for t in TARGETS for v in plan(t).verdicts})
    envs: list[dict[str, Any]] = [
        {"device": "cpu", "torch": f"{t}+cpu", "cpu_capability": "AVX512"} for t in torches
    ]
    envs += [
        {"device": "cuda", "torch": t, "cuda": names.cuda_version(tk), "capability": cap}
        for t in torches
        for tk in toolkits
        if names.cuda_version(tk)
        for cap in ("9.0", "10.0", "12.0")
    ]
    for env in envs:
        made = names.flex_local(env, family)
        assert names.parse_flex_local(made.local_version) == made, made
        assert names.parse_local(made.local_version) is None
        assert made.torch_family == names.torch_family(env["torch"])


def test_runtime_images_of_stable_abi_fa2_and_fa3_wheels_keep_their_profile(tmp_path: Path) -> None:
    """Two profiles of one variant get two tags, also from manifests older than `inputs.profile_tag`."""
    fa2 = next(v.cell for v in plan("fa2-stable").verdicts if v.valid)
    fa3 = next(v.cell for v in plan("fa3-gpu-runner").verdicts if v.valid)
    assert fa2.stable_abi and fa2.profile_tag == "hd128" and fa2.kernel == "flash-attn"
    assert fa3.stable_abi and fa3.profile_tag == "fa3hd64128" and fa3.kernel == "flash-attn-3"
    for cell in (fa2, fa3):
        full = replace(cell, profile="full", profile_spec=ProfileSpec())
        for manifest in (manifest_of(cell), without_tag(manifest_of(cell))):
            manifest["toolchain"] = {"torch": f"{cell.torch}+{cell.toolkit.short}"}
            req = runtime_request(tmp_path / cell.wheel_name, manifest, base="local/debian:bookworm")
            assert req.spec.profile_tag == cell.profile_tag
            assert f"-{cell.variant}-{cell.profile_tag}-py" in req.spec.tag
            plain = runtime_request(tmp_path / full.wheel_name, manifest_of(full), base="b").spec
            assert plain.profile_tag is None
            tags = [s.tag for s in resolve_tags([req.spec, plain])]  # refuses two images on one tag
            assert len(set(tags)) == 2
    # the names the issue found read without their profile: the one parser reads both
    assert names.profile_tag_of("cu130sm90torch2.10abi3.hd128") == "hd128"
    assert names.profile_tag_of("cu130torch2.9abi3.fa3hd64128") == "fa3hd64128"


def test_a_custom_torch_build_is_not_a_profile() -> None:
    cell = next(v.cell for v in plan("default").verdicts)
    custom = replace(cell, torch_build="2.14.0a0+nv", profile="full", profile_spec=ProfileSpec())
    assert custom.local_version == "cu130torch2.14cxx11abiTRUE.pt2140a0nv"
    version = f"{custom.kernel_version}+{custom.local_version}"
    assert parity_profile.profile_tag(version) is None
    assert parity_profile.from_local_version(version).name == "full"
    tagged = replace(custom, profile=cell.profile, profile_spec=cell.profile_spec)
    assert parity_profile.profile_tag(f"{tagged.kernel_version}+{tagged.local_version}") == "fwd128"
    parts = names.parse_local(tagged.local_version)
    assert parts is not None and parts.torch_build == "2140a0nv" and parts.profile_tag == "fwd128"


def test_names_needs_only_the_standard_library() -> None:
    """Imported alone it loads no third-party module (FA4 on a bare GPU host, parity's profile reader)."""
    code = (
        f"import sys; sys.path.insert(0, {str(SRC)!r}); import attnforge.names, json; "
        "top = {m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'__main__'}; "
        "print(json.dumps(sorted(top)))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["attnforge"]
    tree = ast.parse((SRC / "attnforge" / "names.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names} == {
        "attnforge.builder.toolkits"
    }


def test_the_host_takes_toolkit_spellings_from_names_only() -> None:
    """The builder keeps its own copy (it runs alone in build containers); everything else asks names."""
    package = SRC / "attnforge"
    users = []
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if rel.startswith("builder/") or rel == "names.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(
            isinstance(n, ast.ImportFrom) and n.module == "attnforge.builder.toolkits" for n in ast.walk(tree)
        ):
            users.append(rel)
    assert users == []
