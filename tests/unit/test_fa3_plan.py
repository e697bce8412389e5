"""FlashAttention-3 in the matrix: rules with the shipped compat data, stable-ABI naming, the plan's collapse of
abi3 cells into one wheel, the env build's arch choice and the schema's feature vocabulary."""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.core.kernels import KERNELS, all_features, dtypes, features, head_dims
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import CompatData, load_compat
from attnforge.matrix.file import parse_matrix
from attnforge.matrix.plan import plan_target, select_cells
from attnforge.matrix.rules import check
from attnforge.matrix.schema import DisableFeature, Dtype, ProfileSpec
from attnforge.wheels.naming import cell_from_manifest, expected_names, parse_local, torch_pin

Run = Callable[..., tuple[int, str, str]]
SNAPSHOT_SHA = "ce0cca1eaeeac1d1eaaa84c733a4ce9c371c7009b98b7d4aa51d188c5a364f93"
INFER = ProfileSpec(head_dims=[64, 128], dtypes=["bf16", "fp16"], disable=["appendkv", "local", "softcap"])


@pytest.fixture(scope="module")
def data() -> CompatData:
    return load_compat()


def fa3(**kw: object) -> Cell:
    base: dict[str, object] = dict(
        kernel="flash-attn-3",
        kernel_version="3.0.0",
        toolkit=Toolkit.parse("cuda13.0"),
        torch="2.11.0",
        python="3.12",
        cxx11_abi=True,
        arches=("sm_90a",),
        profile="fa3hd64128",
        profile_spec=INFER,
    )
    base.update(kw)
    return Cell(**base)  # type: ignore[arg-type]


def test_valid_cell_is_a_stable_abi_wheel(data: CompatData) -> None:
    v = check(fa3(), data)
    assert v.valid, v.reasons()
    c = v.cell
    assert (c.torch_floor, c.abi3_python, c.stable_abi) == ("2.9", "3.10", True)
    assert c.variant == "cu130-sm90a-torch2.9abi3"
    assert c.local_version == "cu130sm90atorch2.9abi3.fa3hd64128"
    assert c.wheel_name == "flash_attn_3-3.0.0+cu130sm90atorch2.9abi3.fa3hd64128-cp310-abi3-linux_x86_64.whl"
    assert torch_pin(c) == "torch>=2.9"
    # torch 2.14 needs C++20 of full-API extensions; FA3 includes only torch's stable headers: no cxx20 patch
    v14 = check(fa3(torch="2.14.1"), data)
    assert v14.valid and v14.cell.patches == () and any("stable headers" in n for n in v14.notes)


def test_the_wheel_does_not_depend_on_torch_release_or_python(data: CompatData) -> None:
    a, b = (
        check(fa3(torch="2.9.1", python="3.10"), data).cell,
        check(fa3(torch="2.14.1", python="3.13"), data).cell,
    )
    assert a.wheel_name == b.wheel_name and a.kernel_set_key == b.kernel_set_key
    assert a.id != b.id
    other_arch = check(fa3(arches=("sm_80", "sm_90a")), data).cell
    assert (
        other_arch.variant == "cu130-sm80-sm90a-torch2.9abi3"
        and other_arch.kernel_set_key != a.kernel_set_key
    )


@pytest.mark.parametrize(
    ("cell", "rule", "words"),
    [
        (
            fa3(torch="2.8.0"),
            "kernel-requirements",
            "needs torch >= 2.9: hopper/setup.py builds the stable-ABI",
        ),
        (fa3(toolkit=Toolkit.parse("cuda12.2"), torch="2.9.1"), "kernel-requirements", "needs CUDA >= 12.3"),
        (fa3(toolkit=Toolkit.parse("cuda12.6"), torch="2.9.1"), "offline-toolchain", "downloads from NVIDIA"),
        (fa3(toolkit=Toolkit.parse("cuda12.9"), torch="2.9.1"), "offline-toolchain", "use CUDA 12.8, 13.0"),
        (fa3(arches=("sm_90",)), "kernel-requirements", "compiles only sm_80, sm_90a, not sm_90"),
        (fa3(arches=("sm_80",)), "kernel-requirements", "every flash-attn-3 3.0.0 wheel compiles sm_90a"),
        (fa3(arches=("sm_90a", "sm_100")), "kernel-requirements", "not sm_100"),
        (
            fa3(profile_spec=ProfileSpec(disable=["dropout"])),
            "profile",
            "no FLASHATTENTION_DISABLE_ macro for dropout",
        ),
        (fa3(profile_spec=ProfileSpec(dtypes=["fp16"])), "profile", "always compiles bf16"),
        (fa3(profile_spec=ProfileSpec(head_dims=[32])), "profile", "has no head dim [32]"),
        (
            fa3(arches=("sm_80", "sm_90a"), profile_spec=ProfileSpec(disable=["sm80"])),
            "profile",
            "disables the sm80",
        ),
        (fa3(python="3.9", torch="2.9.1"), "torch-python", ""),
    ],
)
def test_refusals_name_the_rule_and_the_reason(data: CompatData, cell: Cell, rule: str, words: str) -> None:
    v = check(cell, data)
    assert not v.valid
    hit = [p for p in v.problems if p.rule == rule]
    assert hit, v.reasons()
    assert words in hit[0].message
    assert hit[0].source or rule in ("torch-python", "profile")


def test_fa2_profiles_may_not_name_fa3_features(data: CompatData) -> None:
    c = Cell(
        kernel="flash-attn",
        kernel_version="2.8.3",
        toolkit=Toolkit.parse("cuda13.0"),
        torch="2.11.0",
        python="3.12",
        cxx11_abi=True,
        arches=("sm_90",),
        profile="p",
        profile_spec=ProfileSpec(disable=["pagedkv"], dtypes=["bf16", "fp8"]),
    )
    reasons = " ".join(check(c, data).reasons())
    assert "no FLASHATTENTION_DISABLE_ macro for pagedkv" in reasons and "has no fp8 kernels" in reasons


def test_recommended_cuda_is_a_note(data: CompatData) -> None:
    v = check(fa3(toolkit=Toolkit.parse("cuda12.8"), torch="2.9.1"), data)
    assert v.valid and v.cell.variant == "cu128-sm90a-torch2.9abi3"
    v13 = check(fa3(), data)
    assert not any("recommends CUDA" in n for n in v13.notes)


def test_local_version_round_trip() -> None:
    for arches, tag in ((("sm_90a",), "fa3hd64128"), (("sm_80", "sm_90a"), None)):
        c = fa3(
            arches=arches,
            torch_floor="2.9",
            abi3_python="3.10",
            profile="full" if tag is None else tag,
            profile_spec=INFER if tag else ProfileSpec(),
        )
        parts = parse_local(c.local_version)
        assert parts is not None and parts.stable_abi
        assert parts.variant == c.variant and parts.profile_tag == tag
    parts = parse_local("cu130sm90atorch2.9abi3.fa3hd64128")
    assert parts is not None
    assert parts.torch_problem("2.11.0+cu130") is None and parts.torch_problem("2.14.1") is None
    assert "torch >= 2.9" in (parts.torch_problem("2.8.0") or "")
    assert parts.accel_problem("cu130") is None and parts.accel_problem("cu132") is None
    assert parts.accel_problem("cu128") and parts.accel_problem("rocm6.4")
    fa2 = parse_local("cu130torch2.14cxx11abiTRUE")
    assert fa2 is not None and not fa2.stable_abi and fa2.accel_problem("cu132")


def test_names_from_a_manifest() -> None:
    manifest = {
        "kernel": "flash-attn-3",
        "kernel_version": "3.0.0",
        "local_version": "cu130sm90atorch2.9abi3.fa3hd64128",
        "inputs": {
            "toolkit": "cuda13.0",
            "torch": "2.11.0",
            "python": "3.12",
            "cxx11_abi": True,
            "arches": ["sm_90a"],
            "profile": "fa3hd64128",
            "torch_floor": "2.9",
            "abi3_python": "3.10",
        },
    }
    names = expected_names(manifest)
    assert names.dist == "flash_attn_3" and names.version == "3.0.0+cu130sm90atorch2.9abi3.fa3hd64128"
    assert names.wheel_tag == "cp310-abi3-linux_x86_64" and names.torch_requirement == "torch>=2.9"
    assert cell_from_manifest(manifest).variant == "cu130-sm90a-torch2.9abi3"


def test_schema_vocabulary_is_kernels_json() -> None:
    assert typing.get_args(DisableFeature) == all_features()
    assert set(typing.get_args(Dtype)) == {d for k in KERNELS for d in dtypes(k)}
    from attnforge.builder.knobs import FA3_FEATURES, FA3_HEAD_DIMS

    assert features("flash-attn-3") == FA3_FEATURES and head_dims("flash-attn-3") == FA3_HEAD_DIMS


MATRIX = """\
version: 1
kernels:
  flash-attn: {version: "2.8.3", source: {sha256: "%s"}}
  flash-attn-3: {version: "3.0.0", source: {kind: path, path: x.tar.gz, sha256: "%s", subdir: hopper}}
profiles:
  full: {}
  small: {head_dims: [64], dtypes: [bf16], disable: [backward]}
defaults: {kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: full}
targets:
  t:
    matrix: {kernel: [flash-attn-3], toolkit: [cuda12.6, cuda12.8, cuda13.0], torch: ["2.8", "2.9", "2.11", "2.14"],
             python: ["3.10", "3.12"], arch: [[sm_90a]], profile: [small]}
    include:
      - {kernel: flash-attn, toolkit: cuda13.0, torch: "2.11", python: "3.12", arch: [sm_90], profile: small}
"""


def test_plan_collapses_abi3_cells_into_one_wheel_per_toolkit(data: CompatData) -> None:
    matrix = parse_matrix(MATRIX % ("1" * 64, SNAPSHOT_SHA))
    p = plan_target(matrix, "t", data)
    s = p.summary()
    # 3 toolkits x 4 torch x 2 Python FA3 cells + 1 FA2: cu12.6 refused (download), torch 2.8 refused
    assert s["cells"] == 25 and s["invalid"] == 8 + 4
    assert s["wheels_by_kernel"] == {"flash-attn": 1, "flash-attn-3": 2}
    assert s["served_by_another_wheel"] == 2 * 3 * 2 - 2
    builders = {c.toolkit.version: c for c in p.valid if c.kernel == "flash-attn-3"}
    # the builder of each wheel: a torch whose PyPI wheel has that CUDA (2.9 is cu128 there, 2.11 cu130)
    assert (builders["12.8"].torch_family, builders["13.0"].torch_family) == ("2.9", "2.11")
    assert builders["13.0"].python == "3.10"
    served = next(v for v in p.verdicts if v.served_by)
    assert select_cells(p, [served.cell.id]) == [next(c for c in p.valid if c.id == served.served_by)]
    row = next(r for r in p.to_json()["cells"] if r["served_by"])
    assert row["valid"] and row["torch_floor"] == "2.9"


def test_flash_attn_3_needs_a_source_with_subdir() -> None:
    from attnforge.core.errors import ConfigurationError

    bad = MATRIX % ("1" * 64, SNAPSHOT_SHA)
    with pytest.raises(ConfigurationError, match="no sdist on the package index"):
        parse_matrix(bad.replace("{kind: path, path: x.tar.gz,", "{"))
    with pytest.raises(ConfigurationError, match="subdir must name the folder"):
        parse_matrix(bad.replace(", subdir: hopper", ""))


def test_the_committed_matrix_plans_fa3_beside_fa2(run_cli: Run, root: Path) -> None:
    code, out, _ = run_cli("--matrix", str(root / "matrix.yaml"), "plan", "-t", "hopper", "--format", "json")
    assert code == 0
    s = json.loads(out)["summary"]
    assert s["wheels_by_kernel"] == {"flash-attn": 2, "flash-attn-3": 4}
    code, out, _ = run_cli("--matrix", str(root / "matrix.yaml"), "plan", "-t", "hopper")
    assert code == 0 and "6 wheels: 2 flash-attn, 4 flash-attn-3" in " ".join(out.split())
    code, out, _ = run_cli(
        "--matrix", str(root / "matrix.yaml"), "plan", "-t", "fa3-gpu-runner", "--format", "json"
    )
    cells = json.loads(out)["cells"]
    assert code == 0 and [c["wheel"] for c in cells] == [
        "flash_attn_3-3.0.0+cu130sm90atorch2.9abi3.fa3hd64128-cp310-abi3-linux_x86_64.whl"
    ]


def test_runner_smoke_imports_the_kernel_of_the_wheel() -> None:
    from attnforge.runner.gpu_smoke import kernel_of_wheel, script_for

    wheel = Path("flash_attn_3-3.0.0+cu130sm90atorch2.9abi3.fa3hd64128-cp310-abi3-manylinux_2_34_x86_64.whl")
    assert kernel_of_wheel(wheel) == "flash-attn-3" and kernel_of_wheel(Path("x.whl")) == "flash-attn"
    script = script_for("flash-attn-3")
    assert 'DIST = "flash_attn_3"' in script and 'API = "flash_attn_interface"' in script
    compile(script, "smoke", "exec")


def test_the_cibuildwheel_export_refuses_fa3(data: CompatData) -> None:
    from attnforge.ci.cibuildwheel_config import cibuildwheel_config
    from attnforge.core.errors import ConfigurationError

    with pytest.raises(
        ConfigurationError, match="maps flash-attn \\(FA2\\) cells only; build flash-attn-3 with"
    ):
        cibuildwheel_config(check(fa3(), data).cell)
