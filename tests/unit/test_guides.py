"""`attnforge docs`: the shipped guides listed, printed as written to a pipe, located, and a wrong topic named."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from attnforge.matrix.compat import TorchRelease

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Run = Callable[..., tuple[int, str, str]]
ROOT = Path(__file__).resolve().parents[2]


def test_docs_lists_every_guide_with_its_title(run_cli: Run) -> None:
    code, out, _ = run_cli("docs")
    assert code == 0
    rows = dict(line.split(None, 1) for line in out.splitlines())
    assert sorted(rows) == sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert rows["records"] == "Signed records: provenance, parity and SBOM"


def test_docs_prints_a_guide_and_its_path(run_cli: Run) -> None:
    code, out, _ = run_cli("docs", "compat-data")
    assert code == 0 and out == (ROOT / "docs" / "compat-data.md").read_text(encoding="utf-8")
    code, out, _ = run_cli("docs", "docs/compat-data.md", "--path")
    assert code == 0 and Path(out.strip()).resolve() == (ROOT / "docs" / "compat-data.md").resolve()


def test_docs_unknown_topic_exit_2_with_a_guess(run_cli: Run) -> None:
    code, _, err = run_cli("docs", "record")
    assert code == 2 and "no guide named 'record': did you mean 'records'?" in err
    assert err.count("\n") == 1


def test_compat_data_guide_example_row_is_a_valid_torch_row() -> None:
    """The overlay example of `attnforge docs compat-data` is a row the compat tables accept as written."""
    text = (ROOT / "docs" / "compat-data.md").read_text(encoding="utf-8")
    section = text.split("## Adding a torch release in your own repository", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```toml\n(.*?)```", section, re.S)
    rows = tomllib.loads("\n".join(line.removeprefix("   ") for line in block.splitlines()))["torch"]
    (row,) = rows
    parsed = TorchRelease.model_validate(row)
    assert parsed.family == "2.16" and parsed.source and set(row) <= set(TorchRelease.model_fields)
