"""`attnforge docs`: the shipped guides listed, printed as written to a pipe, located, and a wrong topic named."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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
