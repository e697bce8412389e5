"""Small user-facing edges: schema output folders, Python spans, targets without a valid cell, unquoted
YAML numbers, unknown toolkits, publish folders, untrusted signers, keys generate/show, ignored wheels."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.core.errors import RecordRefused
from attnforge.matrix.compat import load_compat
from attnforge.matrix.plan import span
from attnforge.wheels.signing_keys import SigningConfig, generate_key, signing_key
from attnforge.wheels.statements import sign, statement, verify
from tests.unit.test_fa4_matrix import FA4, HEAD

Run = Callable[..., tuple[int, str, str]]

MATRIX = """\
version: 1
kernels: {flash-attn: {version: '2.8.3'}}
defaults: {kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: full}
targets:
  good:
    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.12'], arch: [sm_90]}
  old-abi:
    matrix: {toolkit: [cuda12.8], torch: ['2.8'], python: ['3.12'], arch: [sm_90], cxx11_abi: [false]}
"""


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX)
    return path


def test_schema_output_creates_its_folder_and_names_an_unwritable_path(run_cli: Run, tmp_path: Path) -> None:
    out = tmp_path / "docs" / "matrix.schema.json"
    code, _, err = run_cli("schema", "-o", str(out))
    assert code == 0 and json.loads(out.read_text())["title"] == "Matrix", err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = run_cli("schema", "-o", str(blocker / "x.json"))
    assert code == 2 and f"--output {blocker / 'x.json'}: cannot write it" in err
    assert err.count("\n") == 1


def test_span_orders_versions_and_lists_free_threaded_pythons_after() -> None:
    assert span({"3.10", "3.11", "3.12", "3.13", "3.14", "3.14t"}) == "3.10-3.14, 3.14t"
    assert span({"3.12", "3.14t"}) == "3.12, 3.14t"
    assert span({"2.6", "2.9", "2.14"}) == "2.6-2.14"
    assert span({"3.14t"}) == "3.14t"


def test_validate_fails_on_a_target_without_a_valid_cell(run_cli: Run, matrix: Path) -> None:
    code, out, err = run_cli("--matrix", str(matrix), "validate")
    assert "good: 1 valid" in out and "old-abi: 0 valid, 1 invalid" in out
    assert code == 2
    assert "target 'old-abi' has no valid cell" in err and "[torch-abi]" in err and "good" not in err


def test_unquoted_python_version_says_to_quote_it(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX.replace("python: ['3.12']", "python: [3.10]", 1))
    code, _, err = run_cli("--matrix", str(path), "validate")
    assert code == 2
    assert "YAML reads the unquoted 3.10 as the number 3.1: quote it ('3.10')" in err


def test_unknown_toolkit_lists_the_known_ones(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX.replace("[cuda12.8]", "[cuda13.9]"))
    code, _, err = run_cli("--matrix", str(path), "validate")
    assert code == 2 and "cuda13.9 is not in the compat data (known: " in err
    known = load_compat()
    for row in known.cuda:
        assert f"cuda{row.version}" in err
    assert f"rocm{known.rocm[0].version}" in err


def test_publish_refuses_a_missing_parent_and_announces_a_new_index_folder(
    run_cli: Run, matrix: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    target = tmp_path / "missing" / "deeper" / "index"
    code, _, err = run_cli("--matrix", str(matrix), "publish", "--to", str(target), str(empty))
    assert code == 2 and f"{target.parent} does not exist" in err and "create" in err
    assert not (tmp_path / "missing").exists()
    fresh = tmp_path / "index"
    code, _, err = run_cli("--matrix", str(matrix), "publish", "--to", str(fresh), str(empty))
    assert f"{fresh} does not exist yet: it will be created as a new index" in err
    assert code == 7 and "no finalized wheels found" in err, err


def test_untrusted_record_names_the_signer_and_trusted_key_option(tmp_path: Path) -> None:
    generate_key(tmp_path / "site.pem")
    signer = signing_key(SigningConfig(tmp_path / "site.pem"))
    assert signer is not None
    envelope = sign(statement("x.whl", "ab" * 32, "urn:t", {}), signer)
    with pytest.raises(RecordRefused) as refused:
        verify(
            json.dumps(envelope).encode(),
            [],
            what="x.whl.provenance.intoto.json",
            subject_name="x.whl",
            sha256="ab" * 32,
            predicate_type="urn:t",
        )
    text = str(refused.value)
    assert f"signed by {signer.keyid[:16]}" in text and "no trusted key is configured" in text
    assert "--trusted-key" in text


def test_keys_generate_then_show(
    run_cli: Run, matrix: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNFORGE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("ATTNFORGE_SIGNING_KEY", raising=False)
    monkeypatch.delenv("ATTNFORGE_TRUSTED_KEYS", raising=False)
    code, out, err = run_cli("--matrix", str(matrix), "keys", "generate", str(tmp_path / "site.pem"))
    assert code == 0 and "not in use yet" in err and f"ATTNFORGE_SIGNING_KEY={tmp_path / 'site.pem'}" in err
    code, shown, _ = run_cli("--matrix", str(matrix), "keys", "show")
    assert code == 0 and "none configured" in shown and "keys generate" in shown
    code, out, err = run_cli("--matrix", str(matrix), "keys", "generate")
    keyid = out.strip()
    assert code == 0 and (tmp_path / "config" / "signing-key.pem").is_file() and "not in use" not in err
    code, shown, _ = run_cli("--matrix", str(matrix), "keys", "show")
    assert f"signing key: {keyid}" in shown


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_built_wheel_in_the_repository_root_is_ignored(root: Path) -> None:
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(
        ["git", "check-ignore", "-q", "attnforge-0.1.0-py3-none-any.whl"], cwd=root, check=False
    )
    assert proc.returncode == 0


def test_validate_names_the_fa4_reason_of_a_target_of_invalid_fa4_cells(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(
        HEAD
        + "targets:\n  only4:\n    matrix: {kernel: [flash-attn-4], toolkit: [cuda13.0], torch: ['2.11'], "
        "python: ['3.12'], arch: [sm_80]}\n" + FA4,
        encoding="utf-8",
    )
    code, out, err = run_cli("--matrix", str(path), "validate")
    assert "FA4 cells: 0 valid, 1 invalid" in out
    assert code == 2 and "target 'only4' has no valid cell (fa4-cu13-torch2.11-py3.12-sm80: [fa4-arch]" in err
