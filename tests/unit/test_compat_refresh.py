"""`attnforge compat refresh` against a recorded snapshot of PyPI (tests/data/pypi_snapshot.json, taken
2026-11-28): the table without torch 2.15's rows gets them back from the index, with the facts read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.cli import main
from attnforge.matrix.compat import load_compat, packaged_tables
from attnforge.matrix.compat_refresh.index import SnapshotIndex
from attnforge.matrix.compat_refresh.refresh import TORCH_FIELDS, refresh

from .compat_reduced import write_reduced

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "data" / "pypi_snapshot.json"


def _run(*args: str) -> int:
    return main(
        ["--matrix", str(ROOT / "matrix.yaml"), "compat", "refresh", "--snapshot", str(SNAPSHOT), *args]
    )


def test_snapshot_was_taken_from_pypi() -> None:
    data = json.loads(SNAPSHOT.read_text())
    assert data["index"] == "https://pypi.org/simple" and data["taken"] == "2026-11-28"
    assert any(f["filename"].startswith("torch-2.15.0-cp315-") for f in data["projects"]["torch"])


def test_finds_torch_215_python_315_and_cuda_132(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overlay = write_reduced(tmp_path / "compat.toml")
    assert _run("--compat", str(overlay), "--check", "--format", "json") == 1
    found = {(f["table"], f["key"]): f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert found["torch", "2.15"]["kind"] == "new"
    assert found["python", "3.15"]["kind"] == "new"
    assert found["python", "3.15"]["row"]["first_torch"] == "2.15.0"
    cuda = found["cuda", "13.2"]
    assert cuda["kind"] == "unestablished" and "13.2.86" in cuda["summary"] and "left out" in cuda["summary"]
    assert not any(f["kind"] == "changed" for f in found.values())


def test_written_rows_match_the_facts_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overlay = write_reduced(tmp_path / "compat.toml")
    assert _run("--compat", str(overlay), "--write") == 0
    assert "wrote 2 row(s)" in capsys.readouterr().out
    load_compat.cache_clear()
    written = load_compat(str(overlay))
    row = written.torch_release("2.15")
    assert row is not None
    extra = row.model_extra or {}
    assert row.latest == "2.15.0" and row.released == "2026-10-28"
    assert row.python == ["3.11", "3.12", "3.13", "3.14", "3.15"]
    assert row.free_threaded == ["3.14", "3.15"]  # cp314t and cp315t wheels are on the index
    assert row.pypi_cuda == "13.2" and row.cuda == ["13.2"] and row.aarch64_cuda == ["13.2"]
    assert row.cxx_std == 20 and row.philox_offset_intragraph == "uint64_t" and row.cxx11_abi == [True]
    assert extra["requires_python"] == ">=3.11" and extra["refreshed"] == "2026-11-28"
    assert "torch-2.15.0-cp312-cp312-manylinux_2_28_x86_64.whl: torch/version.py cuda='13.2'" in row.source
    assert "cuda 13.2.2" in row.source and "#error C++20" in row.source
    py = written.python_release("3.15")
    assert py is not None and py.first_torch == "2.15.0" and "cp315-cp315" in py.source
    # the same facts as the packaged (hand-written, then refreshed) row
    packaged = next(r for r in packaged_tables()["torch"] if r["family"] == "2.15")
    for name in (*TORCH_FIELDS, "cxx11_abi", "cuda", "aarch64_cuda"):
        assert getattr(row, name, extra.get(name)) == packaged[name], name
    # nothing new on a second run: the overlay now holds what the index has
    assert _run("--compat", str(overlay), "--write") == 0
    assert "nothing to write" in capsys.readouterr().out


def test_shipped_data_is_current_against_the_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("--check") == 0
    assert "nothing new" in capsys.readouterr().out


def test_a_moved_row_is_reported_changed() -> None:
    tables = packaged_tables()
    row = next(r for r in tables["torch"] if r["family"] == "2.15")
    row["python"] = ["3.11", "3.12"]
    row["pypi_cuda"] = "13.0"
    row["cuda"] = ["13.0"]
    report = refresh(tables, SnapshotIndex(SNAPSHOT))
    (finding,) = report.findings
    assert finding.kind == "changed" and set(finding.changes) == {"python", "pypi_cuda", "cuda"}
    assert finding.row["pypi_cuda"] == "13.2" and finding.row["cuda"] == ["13.0", "13.2"]


def test_bad_snapshot_is_a_configuration_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "snap.json"
    bad.write_text("{}")
    assert main(["compat", "refresh", "--snapshot", str(bad)]) == 2
    assert f"index snapshot {bad}" in capsys.readouterr().err


def test_unreachable_index_is_an_environment_problem(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compat", "refresh", "--index-url", "http://127.0.0.1:9/simple"]) == 5
    assert "cannot reach the package index http://127.0.0.1:9/simple" in capsys.readouterr().err


def test_overlay_beside_the_matrix_is_picked_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """refresh --write with no --compat writes compat.overlay.toml beside the matrix; plan then reads it."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((ROOT / "matrix.yaml").read_text())
    overlay = tmp_path / "compat.overlay.toml"
    overlay.write_text('[[torch]]\nfamily = "2.15"\nlatest = "2.15.0"\npython = ["3.11"]\nsource = "test"\n')
    assert main(["--matrix", str(matrix), "compat", "refresh", "--snapshot", str(SNAPSHOT), "--write"]) == 0
    assert "wrote 1 row(s) to " + str(overlay) in capsys.readouterr().out
    written = load_compat(str(overlay)).torch_release("2.15")
    assert written is not None and written.python == ["3.11", "3.12", "3.13", "3.14", "3.15"]
    assert written.cxx_std == 20 and written.pypi_cuda == "13.2"
    assert main(["--matrix", str(matrix), "plan", "-t", "release", "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert any(c["valid"] and c["torch"] == "2.15.0" and c["python"] == "3.15" for c in cells)
