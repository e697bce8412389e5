"""The CLI: help texts, JSON plan output and exit codes for each family of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import MINI_COMPAT

Run = Callable[..., tuple[int, str, str]]


def test_help_lists_commands(run_cli: Run) -> None:
    code, out, _ = run_cli("--help")
    assert code == 0
    for cmd in ("plan", "lock", "schema", "validate"):
        assert cmd in out
    assert "Exit codes" in out


def test_plan_json(run_cli: Run, root: Path) -> None:
    code, out, _ = run_cli(
        "--matrix", str(root / "matrix.yaml"), "--compat", str(MINI_COMPAT), "plan", "--format", "json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["summary"]["valid"] == 1
    assert data["cells"][0]["wheel"].startswith("flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE.fwd128-cp311")


def test_missing_target_exit_2(run_cli: Run, root: Path) -> None:
    code, _, err = run_cli("--matrix", str(root / "matrix.yaml"), "plan", "--target", "relase")
    assert code == 2
    assert "no target named 'relase'" in err and "did you mean 'release'" in err


def test_broken_matrix_exit_2(run_cli: Run, tmp_path: Path) -> None:
    bad = tmp_path / "m.yaml"
    bad.write_text("version: 1\nkernels: {flash-attn: {version: '2.8.3'}}\ntargetz: {}\n")
    code, _, err = run_cli("--matrix", str(bad), "plan")
    assert code == 2
    assert f"{bad}:3:1: unknown key 'targetz'" in err and "did you mean 'targets'" in err
    assert err.count("\n") == 1  # one line, no traceback


def test_empty_plan_exit_3(run_cli: Run, tmp_path: Path) -> None:
    m = tmp_path / "m.yaml"
    m.write_text(
        "version: 1\nkernels: {flash-attn: {version: '2.8.3'}}\n"
        "defaults: {kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: full}\n"
        "targets:\n  t:\n    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.12'], arch: [sm_90]}\n"
        "    exclude: [{python: '3.12'}]\n"
    )
    code, _, err = run_cli("--matrix", str(m), "plan", "-t", "t")
    assert code == 3 and "expands to no cell" in err


def test_schema_export(run_cli: Run) -> None:
    code, out, _ = run_cli("schema")
    assert code == 0
    schema = json.loads(out)
    assert "targets" in schema["properties"]


def test_console_script_exit_code(root: Path) -> None:
    """The installed entry point returns the error's code to the shell."""
    proc = subprocess.run(
        [sys.executable, "-m", "attnforge.cli", "--matrix", str(root / "nope.yaml"), "plan"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "no such matrix file" in proc.stderr
