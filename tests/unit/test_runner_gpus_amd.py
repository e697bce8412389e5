"""The runner's AMD GPU parsers (`attnforge.runner.gpus`) against tool outputs reconstructed from the
documented formats (tests/data/rocm/README.md), and gfx-name normalisation (`runner.arches`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.core.arches import gfx_from_target_version, normalize_gfx
from attnforge.runner.gpus import parse_amd_smi, parse_rocm_smi

DATA = Path(__file__).resolve().parents[1] / "data" / "rocm"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_amd_smi_gpu_data_shape() -> None:
    gpus = parse_amd_smi(read("amd-smi-static-mi300x.json"))
    assert [(g.index, g.name, g.arch, g.vendor) for g in gpus] == [
        (0, "AMD Instinct MI300X", "gfx942", "amd"),
        (1, "AMD Instinct MI300X", "gfx942", "amd"),
    ]


def test_amd_smi_list_shape_after_a_note_line_mixed_gpus() -> None:
    assert [g.arch for g in parse_amd_smi(read("amd-smi-static-mi210-list.json"))] == ["gfx90a", "gfx1100"]


def test_amd_smi_decimal_stepping_and_na() -> None:
    """The fixture that once gave gfx9010: 9.0.10 in decimal is gfx90a; N/A stays unknown."""
    assert [g.arch for g in parse_amd_smi(read("amd-smi-static-decimal-stepping.json"))] == ["gfx90a", ""]


def test_rocm_smi_after_warning_lines() -> None:
    gpus, _driver = parse_rocm_smi(read("rocm-smi-productname-mi250x.json"))
    assert [(g.index, g.name, g.arch) for g in gpus] == [
        (0, "AMD Instinct MI250X", "gfx90a"),
        (1, "AMD Instinct MI250X", "gfx90a"),
    ]


def test_rocm_smi_before_5_7_has_no_arch() -> None:
    gpus, _driver = parse_rocm_smi(read("rocm-smi-productname-old-no-gfx.json"))
    assert [(g.name, g.arch) for g in gpus] == [("Instinct MI210", "")]


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("gfx942", "gfx942"),
        ("GFX942", "gfx942"),
        ("gfx90a", "gfx90a"),
        ("gfx9010", "gfx90a"),
        ("gfx9012", "gfx90c"),
        ("gfx1010", "gfx1010"),
        ("gfx1100", "gfx1100"),
        ("90010", "gfx90a"),
        ("90402", "gfx942"),
        ("110000", "gfx1100"),
        ("120001", "gfx1201"),
        ("0", None),
        ("N/A", None),
        ("amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-", "gfx90a"),
        ("gfx942:sramecc+:xnack-", "gfx942"),
        ("", None),
        ("AMD EPYC 7763", None),
    ],
)
def test_normalize_gfx(raw: str, want: str | None) -> None:
    assert normalize_gfx(raw) == want


def test_target_version_encoding() -> None:
    assert gfx_from_target_version(90010) == "gfx90a"
    assert gfx_from_target_version(90402) == "gfx942"
    assert gfx_from_target_version(90500) == "gfx950"
