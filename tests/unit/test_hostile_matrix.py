"""Hostile matrix files: alias bombs, oversize and deep documents, numbers out of range, undeclared names.

Each is refused quickly with a ConfigurationError (exit 2) that names file:line:col and the limit or field at
fault; nothing is expanded, nothing raises anything else. `hypothesis` checks the alias-aware node count
against the expanded tree and that arbitrary text never escapes as another exception.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from attnforge.core.errors import ConfigurationError
from attnforge.matrix.compat import load_compat
from attnforge.matrix.file import load_matrix, parse_matrix
from attnforge.matrix.plan import plan_target
from attnforge.matrix.yaml_bounds import LIMITS, Limits, check_events

Run = Callable[..., tuple[int, str, str]]

GOOD = """\
version: 1
kernels:
  flash-attn: {version: "2.8.3"}
targets:
  t:
    matrix: {toolkit: [cuda12.8], torch: ["2.8"], python: ["3.12"], arch: [sm_90]}
"""


def bomb(levels: int = 9, fan: int = 9, indent: str = "") -> str:
    """A 'billion laughs': `levels` anchors each listing the previous one `fan` times."""
    lines = [f'{indent}a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"{indent}a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    return "\n".join(lines) + "\n"


def refused(text: str, limits: Limits = LIMITS) -> str:
    with pytest.raises(ConfigurationError) as info:
        parse_matrix(text, "m.yaml", limits)
    return str(info.value)


# ------------------------------------------------------------------------------------------ size and shape


def test_alias_bomb_is_refused_in_well_under_a_second() -> None:
    start = time.monotonic()
    msg = refused(GOOD + "flex:\n" + bomb(indent="  "))  # under a key the schema accepts as anything
    assert time.monotonic() - start < 2.0
    assert msg.startswith("m.yaml:") and "alias bomb" in msg and "max_nodes = 100,000" in msg


def test_alias_bomb_under_an_unknown_key_is_refused_before_validation() -> None:
    msg = refused(GOOD + "bogus:\n" + bomb(indent="  "))
    assert "max_nodes" in msg and "unknown key" not in msg


def test_alias_bomb_through_the_cli(tmp_path: Path, run_cli: Run) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(GOOD + "flex:\n" + bomb(indent="  "))
    start = time.monotonic()
    code, _, err = run_cli("--matrix", str(path), "validate")
    assert code == 2 and f"{path}:" in err and "max_nodes" in err and "Traceback" not in err
    assert time.monotonic() - start < 5.0


def test_recursive_alias_is_refused() -> None:
    msg = refused(GOOD + "flex: &loop\n  again: *loop\n")
    assert "recursive alias" in msg and msg.startswith("m.yaml:")


def test_undefined_alias_is_a_yaml_error_with_its_position() -> None:
    assert refused(GOOD + "flex: {a: *nowhere}\n").startswith("m.yaml:7:")


def test_too_many_aliases() -> None:
    text = GOOD + "flex:\n  x: &x 1\n  l: [" + ", ".join(["*x"] * 1001) + "]\n"
    assert "limit max_aliases = 1,000" in refused(text)


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    assert "limit max_depth = 64" in refused(GOOD + "flex: " + "[" * 200 + "]" * 200 + "\n")
    deeper = refused(
        GOOD + "flex: " + "[" * 50_000 + "]" * 50_000 + "\n"
    )  # libyaml's own limit may come first
    assert deeper.startswith("m.yaml:7:") and ("max_depth" in deeper or "nesting depth" in deeper)


def test_control_character_is_a_yaml_error_with_its_position() -> None:
    assert refused(GOOD + 'flex: {a: "x\x1fy"}\n') == (
        "m.yaml:7:13: invalid YAML: unacceptable character #x001f: control characters are not allowed"
    )


def test_many_nodes_without_aliases() -> None:
    text = GOOD + "flex: {x: [" + ",".join(["1"] * 120_000) + "]}\n"  # 240 KB, under the byte limit
    assert "limit max_nodes = 100,000" in refused(text)


def test_oversize_text_and_file(tmp_path: Path) -> None:
    profiles = "".join(f"  p{i}:\n    description: profile number {i} of many\n" for i in range(40_000))
    text = GOOD + "profiles:\n" + profiles
    assert len(text) > LIMITS.max_bytes
    assert "max_bytes = 1,048,576" in refused(text)
    huge = tmp_path / "matrix.yaml"
    with huge.open("wb") as fh:  # a sparse 4 GiB file: refused from its size, never read
        fh.truncate(4 << 30)
    start = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"4,294,967,296 bytes .* max_bytes"):
        load_matrix(huge)
    assert time.monotonic() - start < 1.0


def test_duplicate_key_is_refused_with_both_lines() -> None:
    msg = refused(GOOD + "targets:\n  u:\n    matrix: {toolkit: [cuda12.8]}\n")
    assert msg.startswith("m.yaml:7:1:") and "duplicate key 'targets' (first at line 4)" in msg


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes(GOOD.encode() + b"# \xff\xfe\n")
    with pytest.raises(ConfigurationError, match="not UTF-8"):
        load_matrix(path)


def test_error_inside_an_aliased_node_points_at_it_without_expanding() -> None:
    text = GOOD.replace(
        'matrix: {toolkit: [cuda12.8], torch: ["2.8"], python: ["3.12"], arch: [sm_90]}',
        'matrix: &m {toolkit: [cuda12.8], torch: ["2.8"], python: ["3.12"], arch: [sm_90], bad: 1}',
    ) + "".join(f"  t{i}: {{matrix: *m}}\n" for i in range(50))
    msg = refused(text)
    assert msg.startswith("m.yaml:6:") and "unknown key 'bad'" in msg


def _expanded(obj: Any) -> int:
    """Nodes of a Python structure as YAML composes it, a shared object counted at every use."""
    if isinstance(obj, dict):
        return 1 + sum(_expanded(k) + _expanded(v) for k, v in obj.items())
    if isinstance(obj, list):
        return 1 + sum(_expanded(v) for v in obj)
    return 1


_scalars = st.one_of(st.integers(-5, 5), st.text("abc", max_size=3), st.booleans(), st.none())


@st.composite
def shared_trees(draw: st.DrawFn) -> Any:
    """Nested lists and dicts in which some sub-lists are the same object (yaml.dump writes &id/*id)."""
    leaves = draw(st.lists(st.lists(_scalars, max_size=4), min_size=1, max_size=3))
    tree = draw(
        st.recursive(
            st.sampled_from(leaves) | _scalars,
            lambda kids: (
                st.lists(kids, max_size=4)
                | st.dictionaries(st.text("xyz", min_size=1, max_size=3), kids, max_size=3)
            ),
            max_leaves=25,
        )
    )
    return {"root": tree, "again": draw(st.sampled_from(leaves))}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_trees())
def test_node_count_is_the_expanded_count(tree: Any) -> None:
    text = yaml.safe_dump(tree)
    nodes = _expanded(tree)
    check_events(text, "t.yaml", Limits(max_nodes=nodes))  # exactly at the limit: accepted
    with pytest.raises(ConfigurationError, match="max_nodes"):
        check_events(text, "t.yaml", Limits(max_nodes=nodes - 1))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
@example("0[:")  # a key with a bracket: once mistaken for one of pydantic's union branch names (IndexError)
def test_arbitrary_text_is_a_matrix_or_a_configuration_error(text: str) -> None:
    with contextlib.suppress(ConfigurationError):
        parse_matrix(text)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="[]{}&*ab:,- \n\"'!|>%@`#", max_size=200))
def test_yaml_punctuation_never_escapes(text: str) -> None:
    with contextlib.suppress(ConfigurationError):
        parse_matrix(GOOD + "flex:\n  x: " + text)


# ------------------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_jobs", "-4"),
        ("max_jobs", "0"),
        ("max_jobs", "true"),
        ("max_jobs", "2.5"),
        ("max_jobs", '"4"'),
        ("nvcc_threads", "0"),
        ("parallel_cells", "-1"),
        ("memory_per_job_gb", "0"),
        ("memory_per_job_gb", "-2"),
        ("memory_per_job_gb", ".nan"),
        ("reserve_memory_gb", "-1"),
        ("reserve_memory_gb", ".inf"),
    ],
)
def test_out_of_range_numbers_are_refused(field: str, value: str) -> None:
    msg = refused(GOOD + f"build:\n  resources:\n    {field}: {value}\n")
    assert msg.startswith("m.yaml:9:5:") and f"build.resources.{field}: must be" in msg


@settings(max_examples=60, deadline=None)
@given(st.integers(-(10**6), 10**6))
def test_max_jobs_is_accepted_exactly_from_one(n: int) -> None:
    text = GOOD + f"build:\n  resources:\n    max_jobs: {n}\n"
    if 1 <= n <= 1024:
        assert parse_matrix(text).build.resources.max_jobs == n
    elif n > 1024:
        assert "is more than any build machine runs at once (at most 1,024" in refused(text)
    else:
        assert "max_jobs: must be a whole number >= 1" in refused(text)


def test_max_jobs_from_the_matrix_never_reaches_a_dry_run(tmp_path: Path, run_cli: Run) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(GOOD + "build:\n  resources:\n    max_jobs: -4\n")
    code, out, err = run_cli("--matrix", str(path), "build", "-t", "t", "--dry-run")
    assert code == 2 and "max_jobs: must be a whole number >= 1 or 'auto' (got -4)" in err
    assert "MAX_JOBS=-4" not in out + err


def test_flex_floats_refuse_nan() -> None:
    from pydantic import ValidationError

    from attnforge.flex.variant import FlexVariant

    with pytest.raises(ValidationError):
        FlexVariant(name="x", score_mod="softcap", softcap=float("nan"))


# ------------------------------------------------------------------------------------------ names and rules


def test_undeclared_profile_points_at_its_line() -> None:
    text = GOOD.replace("arch: [sm_90]}", "arch: [sm_90], profile: [nosuch]}")
    msg = refused(text)
    assert msg.startswith("m.yaml:6:") and "profile 'nosuch' is not declared under 'profiles'" in msg


def test_undeclared_profile_in_an_include_and_a_kernel_in_defaults() -> None:
    inc = GOOD + "    include: [{toolkit: cuda12.8, profile: fwd12}]\nprofiles: {full: {}, fwd128: {}}\n"
    msg = refused(inc)
    assert (
        msg.startswith("m.yaml:7:")
        and "targets.t.include[0].profile" in msg
        and "did you mean 'fwd128'" in msg
    )
    kernel = GOOD.replace("    matrix: {", "    matrix: {kernel: [flash-attn-9], ")
    assert "kernel 'flash-attn-9' is not declared under 'kernels'" in refused(kernel)


def one_cell_plan(root: Path, axes: str) -> Any:
    """The plan of a one-cell target `t` added to the shipped matrix (its defaults and profiles)."""
    text = (root / "matrix.yaml").read_text()
    text = text.replace("\ntargets:\n", f"\ntargets:\n  t:\n    matrix: {{{axes}}}\n", 1)
    return plan_target(parse_matrix(text), "t", load_compat())


def test_python_313_with_torch_24_is_refused_for_the_python(root: Path) -> None:
    plan = one_cell_plan(root, 'toolkit: [cuda12.4], torch: ["2.4"], python: ["3.13"], arch: [sm_90]')
    reasons = plan.verdicts[0].reasons()
    assert reasons == [
        "[torch-python] torch 2.4 has no wheels for Python 3.13 (the first torch with Python 3.13 wheels is 2.5.0)"
    ]


def test_gfx_arch_on_a_cuda_cell_has_one_reason(root: Path) -> None:
    plan = one_cell_plan(root, 'toolkit: [cuda13.0], torch: ["2.14"], python: ["3.11"], arch: [gfx942]')
    assert [p.rule for p in plan.verdicts[0].problems] == ["toolkit-arch"]


def test_plan_of_10000_cells_is_fast_and_plain(tmp_path: Path, run_cli: Run, root: Path) -> None:
    big = """
  big:
    matrix:
      toolkit: [cuda12.4, cuda12.6, cuda12.8, cuda12.9, cuda13.0]
      torch: ["2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14"]
      python: ["3.10", "3.11", "3.12", "3.13"]
      cxx11_abi: [true, false]
      arch: [sm_80, sm_90, [sm_80, sm_90], sm_86, sm_89]
      profile: [full, inference, hd128, fwd128, hd64128]
"""
    path = tmp_path / "matrix.yaml"
    path.write_text((root / "matrix.yaml").read_text().replace("\ntargets:\n", "\ntargets:\n" + big, 1))
    start = time.monotonic()
    code, out, _ = run_cli("--matrix", str(path), "plan", "-t", "big")
    took = time.monotonic() - start
    assert code == 0 and "10000 cells:" in out and "┃" not in out  # plain lines, not a rich table
    assert len(out.splitlines()) > 10_000
    assert took < 10.0, f"plan of 10,000 cells took {took:.1f} s"


def test_limits_are_not_hit_by_the_shipped_matrix(root: Path) -> None:
    text = (root / "matrix.yaml").read_text()
    assert len(text.encode()) < LIMITS.max_bytes // 50
    check_events(text, "matrix.yaml", Limits(max_nodes=5_000, max_depth=16, max_aliases=0))
