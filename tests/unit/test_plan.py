"""Target expansion (GitHub Actions' include/exclude semantics), names and kernel-set keys."""

from __future__ import annotations

import pytest

from attnforge.core.errors import ConfigurationError, NothingToDoError
from attnforge.matrix.compat import CompatData
from attnforge.matrix.file import parse_matrix
from attnforge.matrix.plan import plan_target, select_cells

MATRIX = """\
version: 1
kernels:
  flash-attn: {{version: "2.8.3", source: {{sha256: "{sha}"}}}}
profiles:
  full: {{}}
  lean: {{tag: lean, head_dims: [128], disable: [backward]}}
defaults: {{kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: full}}
targets:
  t:
{body}
"""
SHA = "1" * 64


def plan(body: str, data: CompatData, target: str = "t"):  # type: ignore[no-untyped-def]
    return plan_target(parse_matrix(MATRIX.format(sha=SHA, body=body)), target, data)


def test_product_and_names(mini_compat: CompatData) -> None:
    p = plan(
        "    matrix: {toolkit: [cuda13.0], torch: ['2.14'], python: ['3.11', '3.12'], arch: [sm_90], profile: [lean]}",
        mini_compat,
    )
    assert [c.python for c in p.valid] == ["3.11", "3.12"]
    c = p.valid[0]
    assert c.torch == "2.14.1"
    assert c.variant == "cu130-torch2.14"
    assert c.local_version == "cu130torch2.14cxx11abiTRUE.lean"
    assert c.wheel_name == "flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE.lean-cp311-cp311-linux_x86_64.whl"
    assert c.id == "flash-attn-2.8.3-cu130-torch2.14.1-cp311-abi1-sm90-lean-x86_64"
    # Python is not part of the kernel-set key: both cells share compiled kernels
    assert len(p.kernel_sets()) == 1
    assert p.summary() == {
        "target": "t",
        "cells": 2,
        "valid": 2,
        "invalid": 0,
        "wheels": 2,
        "served_by_another_wheel": 0,
        "wheels_by_kernel": {"flash-attn": 2},
        "kernel_sets": 1,
        "variants": ["cu130-torch2.14"],
    }


def test_full_profile_has_no_tag_and_abi_false_variant(mini_compat: CompatData) -> None:
    p = plan(
        "    matrix: {toolkit: [cuda12.4], torch: ['2.6'], python: ['3.11'], cxx11_abi: [false], arch: [sm_80]}",
        mini_compat,
    )
    c = p.valid[0]
    assert c.local_version == "cu124torch2.6cxx11abiFALSE"
    assert c.variant == "cu124-torch2.6-cxx11abiFALSE"


def test_key_changes_with_arches_profile_and_torch(mini_compat: CompatData) -> None:
    p = plan(
        "    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.12'], arch: [sm_90, [sm_80, sm_90]],"
        " profile: [full, lean]}",
        mini_compat,
    )
    assert len({v.cell.kernel_set_key for v in p.verdicts}) == 4
    # the arches are not in the wheel's file name: cells differing only in them would overwrite each other
    assert len(p.valid) == 2 and all("[same-wheel]" in v.reasons()[0] for v in p.invalid)


def test_exclude_and_include(mini_compat: CompatData) -> None:
    body = """\
    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.11', '3.12'], arch: [sm_90]}
    exclude:
      - {python: '3.11'}
    include:
      - {python: '3.12', profile: lean}
      - {toolkit: cuda13.0, torch: '2.14', python: '3.13', arch: [sm_90, sm_100]}
"""
    p = plan(body, mini_compat)
    got = sorted((c.python, c.profile, str(c.toolkit), c.arches) for c in p.valid)
    assert got == [
        ("3.12", "lean", "cuda12.8", ("sm_90",)),  # include extended the matching combination
        ("3.13", "full", "cuda13.0", ("sm_90", "sm_100")),  # include that matched nothing added a cell
    ]


def test_invalid_cells_carry_reasons(mini_compat: CompatData) -> None:
    p = plan(
        "    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.12', '3.14'], arch: [sm_90]}",
        mini_compat,
    )
    assert len(p.invalid) == 1
    assert p.invalid[0].reasons()[0].startswith("[torch-python]")
    js = p.to_json()
    assert js["summary"]["invalid"] == 1
    assert any(not c["valid"] and c["reasons"] for c in js["cells"])


def test_unknown_target_and_profile(mini_compat: CompatData) -> None:
    with pytest.raises(ConfigurationError, match="no target named 'tt'.*did you mean 't'"):
        plan(
            "    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.12'], arch: [sm_90]}",
            mini_compat,
            "tt",
        )
    with pytest.raises(ConfigurationError, match="profile 'leen'.*did you mean 'lean'"):
        plan(
            "    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.12'], arch: [sm_90], profile: [leen]}",
            mini_compat,
        )


def test_empty_target(mini_compat: CompatData) -> None:
    body = "    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.12'], arch: [sm_90]}\n    exclude:\n      - {python: '3.12'}"
    with pytest.raises(NothingToDoError, match="expands to no cell"):
        plan(body, mini_compat)


def test_select_cells(mini_compat: CompatData) -> None:
    p = plan(
        "    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.12', '3.14'], arch: [sm_90]}",
        mini_compat,
    )
    good = p.valid[0].id
    assert [c.id for c in select_cells(p, [good])] == [good]
    with pytest.raises(ConfigurationError, match="is impossible: \\[torch-python\\]"):
        select_cells(p, [p.invalid[0].cell.id])
    with pytest.raises(ConfigurationError, match="did you mean"):
        select_cells(p, [good[:-2]])
    all_bad = plan(
        "    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.14'], arch: [sm_90]}", mini_compat
    )
    with pytest.raises(NothingToDoError, match="no valid cell"):
        select_cells(all_bad, [])


def test_a_pure_python_wheel_declared_for_two_pythons_is_one_cell() -> None:
    from attnforge.matrix.compat import load_compat

    text = MATRIX.replace(
        "  full: {{}}", "  full: {{}}\n  triton: {{tag: triton, rocm_backend: triton}}"
    ).format(
        sha=SHA,
        body="    matrix: {toolkit: [rocm6.4], torch: ['2.9'], python: ['3.11', '3.12'], arch: [[gfx90a, gfx942]],"
        " profile: [triton]}",
    )
    p = plan_target(parse_matrix(text), "t", load_compat())
    [kept] = p.valid
    [dup] = p.invalid
    assert kept.wheel_name == dup.cell.wheel_name and kept.wheel_name.endswith("-py3-none-any.whl")
    assert kept.python == "3.11"
    assert dup.reasons() == [
        f"[same-wheel] builds the same file as {kept.id} ({kept.wheel_name}); declare one Python for this profile"
    ]


def test_plan_says_which_cells_share_kernel_objects_and_why() -> None:
    """A CUDA 12.8 lane over torch 2.8 (uint32_t offset_intragraph_) and 2.10 (uint64_t): one kernel set, the
    binding converting each torch's Philox state; a torch that includes torch in its kernels is one set per torch."""
    from attnforge.matrix.compat import load_compat

    p = plan(
        "    matrix: {toolkit: [cuda12.8], torch: ['2.8', '2.10'], python: ['3.11', '3.12'], arch: [sm_90]}",
        load_compat(),
    )
    [shared] = p.shared_kernels()
    assert len(shared.cells) == 4
    assert shared.why == (
        "kernel units without torch (patch 'torch-free-kernels'), shared by torch 2.8-2.10 x Python 3.11-3.12; "
        "the binding converts each torch's Philox state to the kernels' own (offset_intragraph_: uint32_t in "
        "2.8, uint64_t in 2.10)"
    )
    assert p.to_json()["kernel_sets"] == [shared.to_json()]
    notes = {v.cell.torch: v.notes for v in p.verdicts}
    assert any("torch 2.8's Philox state (uint32_t offset_intragraph_)" in n for n in notes["2.8.0"])
    assert any("torch 2.10's Philox state (uint64_t offset_intragraph_)" in n for n in notes["2.10.0"])
    old = plan_target(
        parse_matrix(
            MATRIX.replace('version: "2.8.3"', 'version: "2.7.4.post1"').format(
                sha=SHA,
                body="    matrix: {toolkit: [cuda12.6], torch: ['2.6', '2.7'], python: ['3.12'], arch: [sm_90]}",
            )
        ),
        "t",
        load_compat(),
    )
    assert sorted(k.why for k in old.shared_kernels()) == [
        "kernel units include torch 2.6: shared by its Pythons (3.12) only",
        "kernel units include torch 2.7: shared by its Pythons (3.12) only",
    ]
