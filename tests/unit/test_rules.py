"""The compatibility rules, on a small fixed table (tests/data/compat_mini.toml)."""

from __future__ import annotations

import pytest

from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import CompatData, load_compat
from attnforge.matrix.rules import check
from attnforge.matrix.schema import ProfileSpec


def cell(**kw: object) -> Cell:
    base: dict[str, object] = dict(
        kernel="flash-attn",
        kernel_version="2.8.3",
        toolkit=Toolkit.parse("cuda12.8"),
        torch="2.8.0",
        python="3.12",
        cxx11_abi=True,
        arches=("sm_90",),
        profile="full",
    )
    base.update(kw)
    return Cell(**base)  # type: ignore[arg-type]


def rules_hit(c: Cell, data: CompatData) -> list[str]:
    return [p.rule for p in check(c, data).problems]


def test_valid_cell_gets_its_torch_variant(mini_compat: CompatData) -> None:
    v = check(cell(), mini_compat)
    assert v.valid, v.reasons()
    assert v.cell.torch_variant == "cu128"


def test_python_not_shipped_by_torch(mini_compat: CompatData) -> None:
    v = check(cell(python="3.14"), mini_compat)
    assert not v.valid
    assert "torch 2.8 has no wheels for Python 3.14" in v.reasons()[0]


def test_old_abi_refused_where_torch_ships_only_cxx11(mini_compat: CompatData) -> None:
    assert rules_hit(cell(cxx11_abi=False), mini_compat) == ["torch-abi"]
    assert check(cell(torch="2.6.0", toolkit=Toolkit.parse("cuda12.4"), cxx11_abi=False), mini_compat).valid


def test_toolkit_minor_without_torch_wheels_uses_lower_minor(mini_compat: CompatData) -> None:
    v = check(cell(torch="2.6.0", toolkit=Toolkit.parse("cuda12.8")), mini_compat)
    assert v.valid
    assert v.cell.torch_variant == "cu126"
    assert any("minor-version compatibility" in n for n in v.notes)


def test_toolkit_older_than_every_torch_cuda_minor(mini_compat: CompatData) -> None:
    v = check(cell(toolkit=Toolkit.parse("cuda12.4")), mini_compat)
    assert [p.rule for p in v.problems] == ["torch-toolkit"]
    assert "compile with CUDA >= 12.6" in v.reasons()[0]


def test_major_mismatch(mini_compat: CompatData) -> None:
    v = check(cell(toolkit=Toolkit.parse("cuda13.0")), mini_compat)
    assert "no CUDA 13.x wheels" in v.reasons()[0]


def test_blackwell_needs_cuda_12_8(mini_compat: CompatData) -> None:
    v = check(cell(torch="2.6.0", toolkit=Toolkit.parse("cuda12.4"), arches=("sm_90", "sm_100")), mini_compat)
    assert [p.rule for p in v.problems] == ["toolkit-arch"]
    assert "cannot target sm_100" in v.reasons()[0]


def test_fa2_needs_ampere(mini_compat: CompatData) -> None:
    v = check(cell(arches=("sm_75", "sm_90")), mini_compat)
    assert "needs sm_80+" in v.reasons()[0]


def test_cuda13_dropped_old_arches(mini_compat: CompatData) -> None:
    v = check(cell(torch="2.14.1", toolkit=Toolkit.parse("cuda13.0"), arches=("sm_70",)), mini_compat)
    assert "toolkit-arch" in [p.rule for p in v.problems]


def test_torch_2_14_gets_the_cxx20_patch(mini_compat: CompatData) -> None:
    v = check(cell(torch="2.14.1", toolkit=Toolkit.parse("cuda13.0")), mini_compat)
    assert v.valid
    assert v.cell.patches == ("cxx20",)
    assert check(cell(), mini_compat).cell.patches == ()


def test_rocm_cells(mini_compat: CompatData) -> None:
    ck = ProfileSpec(rocm_backend="ck")
    triton = ProfileSpec(rocm_backend="triton", tag="triton")
    ok = check(
        cell(toolkit=Toolkit.parse("rocm6.4"), arches=("gfx942",), profile="ck", profile_spec=ck), mini_compat
    )
    assert ok.valid and ok.cell.torch_variant == "rocm6.4"
    rdna_ck = check(
        cell(toolkit=Toolkit.parse("rocm6.4"), arches=("gfx1100",), profile="ck", profile_spec=ck),
        mini_compat,
    )
    assert "ck backend" in rdna_ck.reasons()[0]
    rdna_triton = check(
        cell(toolkit=Toolkit.parse("rocm6.4"), arches=("gfx1100",), profile="triton", profile_spec=triton),
        mini_compat,
    )
    assert rdna_triton.valid
    assert (
        rules_hit(cell(toolkit=Toolkit.parse("rocm6.4"), arches=("sm_90",)), mini_compat)[0] == "toolkit-arch"
    )


@pytest.mark.parametrize(
    ("kw", "rule"),
    [
        ({"kernel_version": "9.9.9"}, "kernel-known"),
        ({"torch": "1.13.0"}, "torch-known"),
        ({"toolkit": Toolkit.parse("cuda12.3")}, "toolkit-known"),
    ],
)
def test_unknown_inputs_name_their_rule(mini_compat: CompatData, kw: dict[str, object], rule: str) -> None:
    assert rule in rules_hit(cell(**kw), mini_compat)


def test_profile_head_dims_and_macros_checked(mini_compat: CompatData) -> None:
    spec = ProfileSpec(head_dims=[128], disable=["backward"])
    assert check(cell(profile="p", profile_spec=spec), mini_compat).valid


def test_torch_free_kernels_share_one_key_across_a_cuda_lane() -> None:
    data = load_compat(None)  # the real table: flash-attn 2.8.3 names its torch-free patch
    lane = [
        check(cell(torch=t, python=p, toolkit=Toolkit.parse("cuda13.0")), data)
        for t in ("2.12.1", "2.13.0", "2.14.1")
        for p in ("3.11", "3.12")
    ]
    assert all(v.valid for v in lane), [v.reasons() for v in lane]
    cells = [v.cell for v in lane]
    assert all("torch-free-kernels" in c.patches for c in cells)
    # torch 2.14 needs C++20 only for the binding: the kernel units' flags stay those of the other releases
    assert {c.patches for c in cells if c.torch == "2.14.1"} == {("cxx20-binding", "torch-free-kernels")}
    assert len({c.kernel_set_key for c in cells}) == 1
    assert len({c.torch_kernel_set_key for c in cells}) == 3  # before sharing: one set per torch release
    # other arches, ABI or profile are other kernel sets
    other = check(
        cell(torch="2.13.0", toolkit=Toolkit.parse("cuda13.0"), arches=("sm_80", "sm_90")), data
    ).cell
    assert other.kernel_set_key != cells[0].kernel_set_key


def test_kernels_that_include_torch_keep_it_in_the_key() -> None:
    data = load_compat(None)
    old = [
        check(cell(kernel_version="2.7.4.post1", torch=t, toolkit=Toolkit.parse("cuda12.6")), data).cell
        for t in ("2.6.0", "2.7.1")
    ]
    assert not any(c.torch_free_kernels for c in old)
    assert old[0].kernel_set_key != old[1].kernel_set_key
    rocm = check(cell(toolkit=Toolkit.parse("rocm6.4"), arches=("gfx942",), torch="2.8.0"), data).cell
    assert "torch-free-kernels" not in rocm.patches
