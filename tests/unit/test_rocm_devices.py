"""AMD device helpers against tool outputs reconstructed from the documented formats (tests/data/rocm/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.rocm.devices import (
    AMD_DOCKER_FLAGS,
    AmdGpu,
    docker_run_flags,
    gfx_arches,
    gfx_from_target_version,
    normalize_gfx,
    parse_amd_smi_static,
    parse_kfd_topology,
    parse_rocm_smi_productname,
    parse_rocminfo,
    parse_tool_output,
    runs_on,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "rocm"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_docker_flags_are_amds_documented_set() -> None:
    assert docker_run_flags() == [
        "--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video",
        "--security-opt", "seccomp=unconfined",
    ]  # fmt: skip
    assert list(AMD_DOCKER_FLAGS) == docker_run_flags()


def test_docker_flags_for_some_gpus_and_the_render_group() -> None:
    flags = docker_run_flags(["/dev/dri/renderD128", "/dev/dri/renderD136"], group_ids=[109])
    assert flags == [
        "--device", "/dev/kfd", "--device", "/dev/dri/renderD128", "--device", "/dev/dri/renderD136",
        "--group-add", "video", "--security-opt", "seccomp=unconfined", "--group-add", "109",
    ]  # fmt: skip
    assert "/dev/dri" not in flags  # not every GPU


def test_amd_smi_gpu_data_shape() -> None:
    gpus = parse_amd_smi_static(read("amd-smi-static-mi300x.json"))
    assert gpus == [AmdGpu(0, "AMD Instinct MI300X", "gfx942"), AmdGpu(1, "AMD Instinct MI300X", "gfx942")]
    assert gfx_arches(gpus) == ["gfx942"]


def test_amd_smi_list_shape_after_a_note_line_mixed_gpus() -> None:
    gpus = parse_amd_smi_static(read("amd-smi-static-mi210-list.json"))
    assert [g.gfx for g in gpus] == ["gfx90a", "gfx1100"]
    assert gfx_arches(gpus) == ["gfx1100", "gfx90a"]


def test_amd_smi_decimal_stepping_and_na() -> None:
    gpus = parse_amd_smi_static(read("amd-smi-static-decimal-stepping.json"))
    assert [g.gfx for g in gpus] == ["gfx90a", ""]  # gfx9010 is 9.0.10 = gfx90a; N/A stays unknown
    assert gfx_arches(gpus) == ["gfx90a"]


def test_rocm_smi_after_warning_lines() -> None:
    gpus = parse_rocm_smi_productname(read("rocm-smi-productname-mi250x.json"))
    assert gpus == [AmdGpu(0, "AMD Instinct MI250X", "gfx90a"), AmdGpu(1, "AMD Instinct MI250X", "gfx90a")]


def test_rocm_smi_before_5_7_has_no_arch() -> None:
    gpus = parse_rocm_smi_productname(read("rocm-smi-productname-old-no-gfx.json"))
    assert gpus == [AmdGpu(0, "Instinct MI210", "")]
    assert gfx_arches(gpus) == []


def test_rocminfo_gpu_agents_only() -> None:
    gpus = parse_rocminfo(read("rocminfo-mi210.txt"))
    assert gpus == [AmdGpu(0, "AMD Instinct MI210", "gfx90a")]


def test_kfd_topology_without_any_tool() -> None:
    gpus = parse_kfd_topology(DATA / "kfd-topology-mi300x")
    assert [g.gfx for g in gpus] == ["gfx942", "gfx942"]  # node 0 is the CPU (gfx_target_version 0)


def test_dispatch_and_unreadable_output() -> None:
    assert gfx_arches(parse_tool_output("amd-smi", read("amd-smi-static-mi300x.json"))) == ["gfx942"]
    with pytest.raises(ValueError, match="unknown tool"):
        parse_tool_output("nvidia-smi", "")
    with pytest.raises(ValueError, match="no JSON"):
        parse_tool_output("rocm-smi", "ERROR: GPU[0] : Unable to open /dev/kfd")


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("gfx942", "gfx942"), ("GFX942", "gfx942"), ("gfx90a", "gfx90a"), ("gfx9010", "gfx90a"),
        ("gfx9012", "gfx90c"), ("gfx1010", "gfx1010"), ("gfx1100", "gfx1100"), ("90010", "gfx90a"),
        ("90402", "gfx942"), ("110000", "gfx1100"), ("120001", "gfx1201"), ("0", None), ("N/A", None),
        ("amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-", "gfx90a"), ("gfx942:sramecc+:xnack-", "gfx942"),
        ("", None), ("AMD EPYC 7763", None),
    ],
)  # fmt: skip
def test_normalize_gfx(raw: str, want: str | None) -> None:
    assert normalize_gfx(raw) == want


def test_target_version_encoding() -> None:
    assert gfx_from_target_version(90010) == "gfx90a"
    assert gfx_from_target_version(90402) == "gfx942"
    assert gfx_from_target_version(90500) == "gfx950"


def test_runs_on() -> None:
    assert runs_on("ck", ["gfx90a", "gfx942"], "gfx942")[0]
    ok, why = runs_on("ck", ["gfx90a", "gfx942"], "gfx950")
    assert not ok and "not gfx950" in why
    assert runs_on("ck", ["gfx90a"], "gfx9010")[0]  # a mis-decoded name still matches
    assert runs_on("triton", [], "gfx1100")[0]  # JIT: nothing compiled, the device decides
    assert not runs_on("triton", [], "gfx906")[0]
    with pytest.raises(ValueError):
        runs_on("hip", [], "gfx942")
