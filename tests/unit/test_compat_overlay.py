"""`--compat FILE` is an overlay over the packaged tables: same key replaces, new rows add."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.cli import main
from attnforge.core.errors import ConfigurationError
from attnforge.matrix.compat import load_compat, packaged_tables

ROOT = Path(__file__).resolve().parents[2]


def test_overlay_replaces_same_key_and_adds_new_rows(tmp_path: Path) -> None:
    overlay = tmp_path / "compat.overlay.toml"
    overlay.write_text(
        '[[torch]]\nfamily = "2.14"\nlatest = "2.14.9"\npython = ["3.12"]\nsource = "test"\n\n'
        '[[torch]]\nfamily = "2.99"\nlatest = "2.99.0"\npython = ["3.15"]\nsource = "test"\n'
    )
    packaged = load_compat()
    merged = load_compat(str(overlay))
    assert len(merged.torch) == len(packaged.torch) + 1
    row = merged.torch_release("2.14")
    assert row is not None and row.latest == "2.14.9" and row.python == ["3.12"]
    assert merged.torch_release("2.99") is not None
    # position kept: the replaced row sits where the packaged one was
    assert [t.family for t in merged.torch][: len(packaged.torch)] == [t.family for t in packaged.torch]
    assert merged.cuda == packaged.cuda and merged.kernel == packaged.kernel


def test_kernel_rows_key_on_name_and_version(tmp_path: Path) -> None:
    overlay = tmp_path / "o.toml"
    overlay.write_text(
        '[[kernel]]\nname = "flash-attn"\nversion = "2.8.3"\nmin_torch = "2.9"\nsource = "test"\n'
    )
    merged = load_compat(str(overlay))
    row = merged.kernel_release("flash-attn", "2.8.3")
    assert row is not None and row.min_torch == "2.9"
    assert len(merged.kernel) == len(packaged_tables()["kernel"])


def test_standalone_table_replaces_everything() -> None:
    mini = load_compat(str(ROOT / "tests" / "data" / "compat_mini.toml"))
    assert len(mini.torch) < len(load_compat().torch)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[[torchh]]\nfamily = '2.1'\n", "unknown table [[torchh]]"),
        ("[[torch]]\nfamily = '2.99'\n", "torch.11."),
        ("[[torch]\n", "Expected"),
    ],
)
def test_bad_overlay_is_one_line_error_naming_the_file(tmp_path: Path, text: str, needle: str) -> None:
    overlay = tmp_path / "bad.toml"
    overlay.write_text(text)
    with pytest.raises(ConfigurationError) as err:
        load_compat(str(overlay))
    assert str(overlay) in str(err.value) and needle in str(err.value)


def test_cli_plan_reads_the_overlay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overlay = tmp_path / "o.toml"
    overlay.write_text("[[torchh]]\n")
    code = main(["--matrix", str(ROOT / "matrix.yaml"), "--compat", str(overlay), "validate"])
    assert code == 2
    assert "unknown table [[torchh]]" in capsys.readouterr().err
