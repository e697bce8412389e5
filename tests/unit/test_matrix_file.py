"""matrix.yaml parsing: every bad input is one clear line naming file:line:col."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnforge.core.errors import ConfigurationError
from attnforge.matrix.file import load_matrix, parse_matrix

GOOD = """\
version: 1
kernels:
  flash-attn: {version: "2.8.3"}
targets:
  t:
    matrix: {toolkit: [cuda12.8], torch: ["2.8"], python: ["3.12"], arch: [sm_90]}
"""


def test_the_shipped_matrix_loads(root: Path) -> None:
    m = load_matrix(root / "matrix.yaml")
    assert {"default", "release", "nightly"} <= set(m.targets)
    assert m.kernels["flash-attn"].source.sha256


def test_good_minimal_matrix() -> None:
    m = parse_matrix(GOOD)
    assert m.targets["t"].matrix.toolkit == ["cuda12.8"]


def test_broken_yaml_reports_line_and_column() -> None:
    with pytest.raises(ConfigurationError) as e:
        parse_matrix("version: 1\nkernels:\n\tflash-attn: x\n", "m.yaml")
    assert str(e.value).startswith("m.yaml:3:1:")
    assert "invalid YAML" in str(e.value)


def test_unknown_key_suggests_the_right_one() -> None:
    text = GOOD.replace("    matrix:", "    matrx:")
    with pytest.raises(ConfigurationError) as e:
        parse_matrix(text, "m.yaml")
    msg = str(e.value)
    assert "unknown key 'matrx'" in msg and "did you mean 'matrix'" in msg
    assert msg.startswith("m.yaml:6:5")


def test_unknown_nested_key_in_build_resources() -> None:
    text = GOOD + "build:\n  resources:\n    max_job: 4\n"
    with pytest.raises(
        ConfigurationError, match=r"m.yaml:9:5: unknown key 'max_job'.*did you mean 'max_jobs'"
    ):
        parse_matrix(text, "m.yaml")


def test_unquoted_python_version_is_explained() -> None:
    text = GOOD.replace('python: ["3.12"]', "python: [3.10]")
    with pytest.raises(ConfigurationError, match="python"):
        parse_matrix(text)


def test_bad_toolkit_spelling() -> None:
    with pytest.raises(ConfigurationError, match="'cu128' must look like 'cuda12.8'"):
        parse_matrix(GOOD.replace("cuda12.8", "cu128"))


def test_credentials_are_references_only() -> None:
    text = GOOD + "destinations:\n  d: {kind: pypiserver, url: 'http://x', password: hunter2}\n"
    with pytest.raises(ConfigurationError, match="unknown key 'password'.*password_env|password_file"):
        parse_matrix(text, "m.yaml")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no such matrix file"):
        load_matrix(tmp_path / "nope.yaml")


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ConfigurationError, match="expected a mapping"):
        parse_matrix("- 1\n- 2\n")
