"""FA4 in matrix.yaml: the `fa4` section (stack per CUDA major, declarations) parses and refuses mistakes at
file:line:col; targets name FA4 cells as kernel flash-attn-4 and `attnforge plan` lists them with their
wheel, or refused with the FA4 rules' reasons."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest

from attnforge.core.errors import ConfigurationError, NothingToDoError
from attnforge.fa4 import declare
from attnforge.matrix import fa4_cells
from attnforge.matrix.compat import CompatData
from attnforge.matrix.fa4_section import FA4Declaration
from attnforge.matrix.file import load_matrix, parse_matrix
from attnforge.matrix.plan import plan_target, select_cells

ROOT = Path(__file__).resolve().parents[2]
SHA = "1" * 64
HEAD = f"""\
version: 1
kernels:
  flash-attn: {{version: "2.8.3", source: {{sha256: "{SHA}"}}}}
defaults: {{kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: full}}
"""
FA4 = """\
fa4:
  stack:
    common: {flash-attn-4: "4.0.0b36", nvidia-cutlass-dsl: "4.8.1", apache-tvm-ffi: "0.1.15.post2",
             quack-kernels: "0.6.5", einops: null}
    cuda13: {nvidia-cutlass-dsl-libs-cu13: "4.8.1"}
  declarations:
    - {name: gqa, head_dim: 128, heads_q: 32, heads_kv: 8}
"""
TARGETS = """\
targets:
  t:
    matrix:
      kernel: [flash-attn, flash-attn-4]
      toolkit: [cuda13.0]
      torch: ["2.11", "2.14"]
      python: ["3.12"]
      arch: [sm_90]
    include:
      - {kernel: flash-attn-4, toolkit: cuda13.0, torch: "2.10", python: "3.12", arch: [sm_80, sm_100]}
      - {kernel: flash-attn-4, toolkit: cuda12.8, torch: "2.11", python: "3.12", arch: sm_90}
      - {kernel: flash-attn-4, toolkit: rocm6.4, torch: "2.11", python: "3.12", arch: gfx942}
  only4:
    matrix: {kernel: [flash-attn-4], toolkit: [cuda13.0], torch: ["2.11"], python: ["3.12"], arch: [sm_90]}
"""


def matrix(fa4: str = FA4, targets: str = TARGETS):  # type: ignore[no-untyped-def]
    return parse_matrix(HEAD + targets + fa4, "m.yaml")


def test_repo_matrix_declares_the_stack_and_the_h100_declarations() -> None:
    section = load_matrix(ROOT / "matrix.yaml").fa4
    assert section is not None and section.version == "4.0.0b36"
    assert section.cuda_majors == [12, 13]
    assert "nvidia-cutlass-dsl-libs-cu12==4.8.1" in section.requirements(12)
    assert "nvidia-cutlass-dsl-libs-cu13==4.8.1" in section.requirements(13)
    assert not any("cu12" in r for r in section.requirements(13))
    # the five declarations run on the H100 (benchmarks/fa4_decls_h100.json), read as the GPU worker reads them
    from_matrix = declare.parse_all([d.to_json() for d in section.declarations])
    assert from_matrix == declare.load(ROOT / "benchmarks" / "fa4_decls_h100.json")
    assert [d.name for d in from_matrix][-1] == "hf-llama-gqa4-d128" and len(from_matrix) == 5


def test_declaration_schema_allows_what_the_worker_allows() -> None:
    assert get_args(FA4Declaration.model_fields["head_dim"].annotation) == fa4_cells.HEAD_DIMS
    assert get_args(FA4Declaration.model_fields["dtype"].annotation) == fa4_cells.DTYPES
    assert set(FA4Declaration.model_fields) == declare._FIELDS


@pytest.mark.parametrize(
    ("decl", "at", "words"),
    [
        (
            "{name: gqa, head_dim: 80}",
            "head_dim",
            r"fa4\.declarations\[1\]\.head_dim: Input should be 64, 96, 128",
        ),
        ("{name: gqa2, heads_q: 32, heads_kv: 5}", "{", r"heads_q 32 is not a multiple of heads_kv 5"),
        (
            "{name: x, head_dims: 64}",
            "head_dims",
            r"unknown key 'head_dims' in fa4\.declarations\[1\]; did you mean 'head_dim'",
        ),
        ("{name: x, training: 'yes'}", "training", r"training: Input should be a valid boolean"),
        ("{name: x, seq_lens: []}", "seq_lens", r"seq_lens: List should have at least 1 item"),
        ("{name: 'a b'}", "name", r"name: String should match pattern"),
    ],
)
def test_bad_declaration_names_file_line_col(decl: str, at: str, words: str) -> None:
    text = HEAD + TARGETS + FA4 + f"    - {decl}\n"
    line = text.count("\n")  # the declaration is the last line
    col = len("    - ") + decl.index(at) + 1
    with pytest.raises(ConfigurationError, match=rf"^m\.yaml:{line}:{col}: .*{words}") as e:
        parse_matrix(text, "m.yaml")
    assert "\n" not in str(e.value)


def test_bad_stack_and_undeclared_fa4_are_refused_at_their_line() -> None:
    stack_line = (HEAD + TARGETS + FA4).splitlines().index("  stack:") + 1
    with pytest.raises(
        ConfigurationError, match=rf"^m\.yaml:{stack_line}:3: fa4\.stack: .*cuda13 must pin .*-cu13"
    ):
        matrix(FA4.replace('nvidia-cutlass-dsl-libs-cu13: "4.8.1"', 'nvidia-cutlass-dsl-libs-cu12: "4.8.1"'))
    with pytest.raises(ConfigurationError, match=r"fa4\.stack: .*CUDA 12, 13 only"):
        matrix(FA4.replace("cuda13:", "cuda11:").replace("-cu13", "-cu11"))
    with pytest.raises(ConfigurationError, match=r"common must pin quack-kernels"):
        matrix(FA4.replace('quack-kernels: "0.6.5", ', ""))
    dup = FA4 + "    - {name: gqa}\n"
    with pytest.raises(ConfigurationError, match=r"^m\.yaml:\d+:3: fa4\.declarations: .*'gqa' is used twice"):
        matrix(dup)
    # a target naming flash-attn-4 without the fa4 section: the kernel is not declared, at the target's line
    with pytest.raises(
        ConfigurationError,
        match=r"^m\.yaml:8:28: targets\.t\.matrix\.kernel\[1\]: kernel 'flash-attn-4' needs the top-level 'fa4'",
    ):
        matrix(fa4="")


def test_plan_lists_fa4_cells_with_wheels_and_refusals(mini_compat: CompatData) -> None:
    p = plan_target(matrix(), "t", mini_compat)
    assert {c.kernel for c in p.valid} == {"flash-attn"}  # FA2 cells as before, FA4 cells beside them
    by_id = {v.id: v for v in p.fa4}
    ok = by_id["fa4-cu13-torch2.11-py3.12-sm90"]
    assert ok.valid and ok.variant == "fa4v4.0.0b36.cu13.sm90"
    assert ok.wheel == "attnforge_fa4_kernels-0.1.0+fa4v4.0.0b36.cu13.sm90-py312-none-any.whl"
    newer = by_id["fa4-cu13-torch2.14-py3.12-sm90"]
    assert newer.valid and newer.served_by == ok.id and newer.wheel == ok.wheel  # no torch in the wheel
    assert by_id["fa4-cu13-torch2.10-py3.12-sm80"].problems == [
        "[fa4-arch] FA4 cells are sm_90, sm_100 or sm_120, not sm_80",
        "[fa4-torch] torch 2.10 is below 2.11, the oldest torch this FA4 stack has been run with",
    ]
    assert by_id["fa4-cu13-torch2.10-py3.12-sm100"].problems[0].startswith("[fa4-torch]")  # one cell per arch
    assert by_id["fa4-cu12-torch2.11-py3.12-sm90"].problems == [
        "[fa4-cuda] matrix.yaml's fa4.stack pins no stack for CUDA 12 (cuda12)",
        "[fa4-torch-cuda] torch 2.11 is built for CUDA 13 on the package index, not CUDA 12",
    ]
    assert (
        by_id["fa4-rocm6.4-torch2.11-py3.12-gfx942"].problems[0].startswith("[fa4-cuda] FA4 runs on NVIDIA")
    )
    row = next(r for r in p.to_json()["fa4_cells"] if r["id"] == "fa4-cu12-torch2.11-py3.12-sm90")
    assert row["valid"] is False and row["wheel"] is None and row["reasons"][0].startswith("[fa4-cuda]")
    only = plan_target(matrix(), "only4", mini_compat)
    assert not only.verdicts and [v.id for v in only.fa4] == ["fa4-cu13-torch2.11-py3.12-sm90"]
    with pytest.raises(NothingToDoError, match="FA4 cells only: `attnforge fa4 build`"):
        select_cells(only, [])


def test_cli_plan_shows_fa4_cells_and_reasons(
    tmp_path: Path, run_cli: Callable[..., tuple[int, str, str]]
) -> None:
    m = tmp_path / "matrix.yaml"
    m.write_text(HEAD + TARGETS + FA4, encoding="utf-8")
    code, out, _ = run_cli("--matrix", str(m), "plan", "-t", "only4", "--format", "json")
    assert code == 0 and json.loads(out)["fa4_cells"][0]["wheel"].endswith("cu13.sm90-py312-none-any.whl")
    code, out, _ = run_cli("--matrix", str(m), "plan", "-t", "t")
    assert code == 0
    flat = " ".join(out.split())
    assert "6 FA4 cells: 2 valid, 4 invalid; 1 kernel wheels" in flat
    assert "invalid fa4-cu13-torch2.10-py3.12-sm80: [fa4-arch]" in flat
    code, out, _ = run_cli("--matrix", str(m), "plan", "-t", "t", "--format", "json")
    rows = {r["id"]: r for r in json.loads(out)["fa4_cells"]}
    assert rows["fa4-cu13-torch2.14-py3.12-sm90"]["served_by"] == "fa4-cu13-torch2.11-py3.12-sm90"
    code, out, _ = run_cli("--matrix", str(m), "validate")
    assert code == 0 and "only4: 0 valid, 0 invalid, 0 kernel-sets, FA4 cells: 1 valid, 0 invalid" in out


def test_fa4_build_compiles_matrix_declarations(
    tmp_path: Path, run_cli: Callable[..., tuple[int, str, str]]
) -> None:
    m = tmp_path / "matrix.yaml"
    m.write_text(HEAD + TARGETS + FA4, encoding="utf-8")
    out = tmp_path / "fa4"
    # /bin/true stands in for the GPU interpreter: what is checked is the declarations handed to the worker
    code, _, err = run_cli("--matrix", str(m), "fa4", "build", "--out", str(out), "--python", "/bin/true")
    assert code == 0, err
    written = json.loads((out / "declarations.json").read_text())
    assert written == [{"name": "gqa", "head_dim": 128, "heads_q": 32, "heads_kv": 8}]
    assert declare.load(out / "declarations.json")[0].gqa_ratio == 4
    code, _, err = run_cli("--matrix", str(tmp_path / "none.yaml"), "fa4", "build", "--python", "/bin/true")
    assert code == 2 and "no such matrix file" in err
