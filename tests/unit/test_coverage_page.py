"""The index's coverage page: the grid (states from the index and the plan), its HTML (tables a screen reader can
use, no script needed), the plan kept across generations, and the install texts shared with `which`."""

from __future__ import annotations

import json
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from attnforge.client.which import resolve, with_torch
from attnforge.core.errors import ConfigurationError
from attnforge.engine.environment import Env
from attnforge.matrix.project import Project
from attnforge.publish.coverage import ANY_PYTHON, Section, build_sections
from attnforge.publish.coverage_page import CoveragePage
from attnforge.publish.coverage_plan import PlanSnapshot, snapshot
from attnforge.publish.index import StaticIndex
from attnforge.publish.install_commands import pip_command, platform_marker, uv_config
from attnforge.publish.yank import set_yanked
from tests.unit.test_wheels_index import make_bundle
from tests.unit.test_wheels_resolver import probe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MATRIX = """\
version: 1
kernels: {flash-attn: {version: "2.8.3"}}
defaults: {kernel: flash-attn, cxx11_abi: true, platform: x86_64, profile: full, arch: [sm_90]}
targets:
  release:
    matrix: {toolkit: [cuda12.4, cuda13.0], torch: ["2.13.0", "2.14.1"], python: ["3.11", "3.12"]}
  broken:
    matrix: {toolkit: [cuda13.0], torch: ["2.14.1"], python: ["3.11"]}
    exclude: [{python: "3.11"}]
"""


def project(tmp_path: Path) -> Project:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    return Project(tmp_path / "matrix.yaml")


def bundles(tmp_path: Path) -> list[Any]:
    out = []
    for local, torch in (("cu130torch2.14cxx11abiTRUE", "2.14.1"), ("cu130torch2.13cxx11abiTRUE", "2.13.0")):
        b = make_bundle(tmp_path / "in", local)
        b.manifest["inputs"].update(torch=torch, profile="full", platform="x86_64", arches=["sm_90"])
        out.append(b)
    out[0].manifest["parity"] = {
        "passed": True,
        "device": "NVIDIA H100 80GB HBM3",
        "driver": "580.65.06",
        "date": "2026-11-20T10:00:00+00:00",
        "report": "https://ci.example.org/4711/parity.md",
    }
    out[0].gate = "passed"  # what publish's gate sets when the wheel's signed parity record passed
    return out


@pytest.fixture
def index(tmp_path: Path) -> StaticIndex:
    idx = StaticIndex(tmp_path / "index", root_page=CoveragePage(snapshot(project(tmp_path))))
    idx.publish(bundles(tmp_path))
    return idx


def coverage(index: StaticIndex) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((index.root / "coverage.json").read_text())
    return data


def cell(sections: list[dict[str, Any]], row: str, python: str) -> list[dict[str, Any]]:
    (section,) = sections
    (found,) = [r for r in section["rows"] if r["label"] == row]
    return list(found["cells"].get(python, []))


def test_states_come_from_the_index_and_the_plan(index: StaticIndex) -> None:
    data = coverage(index)
    sections = data["sections"]
    assert [(s["kernel"], s["profile"], s["pythons"]) for s in sections] == [
        ("flash-attn", "full", ["3.11", "3.12"])
    ]
    assert [r["label"] for r in sections[0]["rows"]] == [
        "CUDA 12.4 · torch 2.13",
        "CUDA 12.4 · torch 2.14",
        "CUDA 13.0 · torch 2.13",
        "CUDA 13.0 · torch 2.14",
    ]
    (passed,) = cell(sections, "CUDA 13.0 · torch 2.14", "3.11")
    assert passed["state"] == "parity-passed" and passed["parity"]["driver"] == "580.65.06"
    assert passed["pip"] == pip_command("flash-attn", passed["version"], "INDEX_URL", "cu130-torch2.14")
    (built,) = cell(sections, "CUDA 13.0 · torch 2.13", "3.11")
    assert built["state"] == "built" and built["parity"] is None
    (not_built,) = cell(sections, "CUDA 13.0 · torch 2.13", "3.12")
    assert not_built["state"] == "not-built"
    assert not_built["cell_id"] == "flash-attn-2.8.3-cu130-torch2.13.0-cp312-abi1-sm90-full-x86_64"
    (refused,) = cell(sections, "CUDA 12.4 · torch 2.14", "3.12")
    assert refused["state"] == "refused" and refused["reasons"][0].startswith("[torch-toolkit] torch 2.14")
    assert data["summary"] == {"parity-passed": 1, "built": 1, "yanked": 0, "not-built": 2, "refused": 4}
    # a target that cannot be planned is named, not fatal
    assert data["plan"]["notes"] == [
        "target broken: not planned: target 'broken' expands to no cell (check its matrix, include and exclude)"
    ]


def test_a_yank_keeps_the_plan_and_shows_the_reason(index: StaticIndex) -> None:
    before = coverage(index)["plan"]
    (name,) = [f for f in index.records() if "torch2.14" in f]
    set_yanked(index, name, "wrong results")
    data = coverage(index)
    assert data["plan"] == before  # the yank had no matrix: the page keeps the plan it had
    (yanked,) = cell(data["sections"], "CUDA 13.0 · torch 2.14", "3.11")
    assert yanked["state"] == "yanked" and yanked["yanked"] == "wrong results"
    assert yanked["pip"] is None and yanked["uv"] is None  # never offered for installing


def test_a_manifest_alone_does_not_make_parity_passed(tmp_path: Path) -> None:
    """The manifest is not signed: "parity passed" needs publish's verdict from the signed parity record."""
    idx = StaticIndex(tmp_path / "index", root_page=CoveragePage(snapshot(project(tmp_path))))
    made = bundles(tmp_path)
    made[0].gate = "not-required"  # the manifest says passed; no signed parity record did
    idx.publish(made)
    data = coverage(idx)
    (entry,) = cell(data["sections"], "CUDA 13.0 · torch 2.14", "3.11")
    assert entry["state"] == "built" and entry["parity"]["signed"] is False
    assert data["summary"]["parity-passed"] == 0
    page = (idx.root / "index.html").read_text()
    assert "Parity passed (says the manifest: no signed parity record) on NVIDIA H100 80GB HBM3" in page


class Structure(HTMLParser):
    """The parts of the page a screen reader and a no-script browser depend on."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.th_scopes: dict[str, set[str | None]] = {"thead": set(), "tbody": set()}
        self.captions = 0
        self.tables = 0
        self.label_for: set[str] = set()
        self.ids: set[str] = set()
        self.form: dict[str, str | None] = {}
        self.html_lang: str | None = None
        self.script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "html":
            self.html_lang = a.get("lang")
        elif tag == "table":
            self.tables += 1
        elif tag == "caption":
            self.captions += 1
        elif tag == "th":
            part = "thead" if "thead" in self.stack else "tbody"
            self.th_scopes[part].add(a.get("scope"))
        elif tag == "label":
            self.label_for.add(str(a.get("for")))
        elif tag == "form":
            self.form = a
        elif tag == "script":
            self.script = True
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        while self.stack and self.stack.pop() != tag:
            pass


def test_the_page_is_tables_with_headers_and_works_without_script(index: StaticIndex) -> None:
    page = (index.root / "index.html").read_text()
    s = Structure()
    s.feed(page)
    assert s.html_lang == "en" and s.tables == s.captions == 2  # the published wheels, the grid
    assert s.th_scopes == {"thead": {"col"}, "tbody": {"row"}}
    assert s.label_for == {"filter-text", "filter-state"} <= s.ids  # every control has its label
    assert "hidden" in s.form and s.form["role"] == "search"  # the script shows the filter it drives
    assert s.script
    # every state is a word; the rows refused in every cell are folded, each rule's sentence written once
    assert '<strong class="state">parity passed</strong>' in page
    assert "<summary>4 cells refused by a rule, under the 2 reasons the rules give</summary>" in page
    assert '<strong class="rules">torch-toolkit</strong>, 2 cells: torch 2.14&#x27;s oldest' in page
    assert (
        "Parity passed on NVIDIA H100 80GB HBM3, driver 580.65.06, 2026-11-20T10:00:00+00:00; "
        '<a href="https://ci.example.org/4711/parity.md">parity report</a>' in page
    )
    # the install commands name the index INDEX_URL; the script puts the page's address there
    assert '<span class="nw">--index-url</span> INDEX_URL/cu130-torch2.14/simple</code>' in page
    assert 'split("INDEX_URL").join(root)' in page
    # the variant trees are still linked from the root
    assert '<a href="cu130-torch2.14/simple/">' in page and '<a href="all/simple/">' in page


def test_a_stable_abi_wheel_is_one_row_serving_a_range() -> None:
    from attnforge.publish.coverage_plan import PlannedCell

    planned = PlannedCell(
        cell_id="flash-attn-2.8.3-cu130-torch2.11.0-cp311-abi1-sm90-hd128-x86_64",
        target="stable",
        kernel="flash-attn",
        kernel_version="2.8.3",
        profile="hd128",
        toolkit="cuda13.0",
        torch="2.11.0",
        python="3.11",
        cxx11_abi=True,
        platform="x86_64",
        arches=("sm_90",),
        variant="cu130-sm90-torch2.10abi3",
        wheel="flash_attn-2.8.3+cu130sm90torch2.10abi3.hd128-cp310-abi3-linux_x86_64.whl",
        torch_floor="2.10",
        abi3_python="3.10",
    )
    served = PlannedCell(
        **{
            **planned.to_json(),
            "cell_id": "x",
            "torch": "2.12.1",
            "served_by": planned.cell_id,
            "arches": ("sm_90",),
        }
    )
    (section,) = build_sections({}, {}, PlanSnapshot("m", [planned, served], []))
    assert isinstance(section, Section) and section.pythons == []
    (row,) = section.rows
    assert row.stable and row.label == "CUDA 13.0 · sm90 · torch ≥ 2.10 (stable ABI)"
    assert row.span_label == "one stable-ABI (abi3) wheel for torch ≥ 2.10 and Python ≥ 3.10"
    assert [e.state for e in row.cells[ANY_PYTHON]] == [
        "not-built"
    ]  # one entry: the served cell is the same wheel


def test_snapshot_without_a_matrix_is_none(tmp_path: Path) -> None:
    assert snapshot(Project(tmp_path / "matrix.yaml")) is None


# ---------------------------------------------------------------- the texts `which` and the page share


@pytest.mark.parametrize(
    ("filename", "marker"),
    [
        (
            "flash_attn-2.8.3+x-cp311-cp311-linux_x86_64.whl",
            "sys_platform == 'linux' and platform_machine == 'x86_64'",
        ),
        (
            "flash_attn-2.8.3+x-cp311-cp311-manylinux_2_28_aarch64.whl",
            "sys_platform == 'linux' and platform_machine == 'aarch64'",
        ),
        ("flash_attn-2.8.3+x-py3-none-any.whl", None),
    ],
)
def test_platform_marker(filename: str, marker: str | None) -> None:
    assert platform_marker(filename) == marker


def test_uv_config_is_toml_naming_the_all_tree_explicitly() -> None:
    text = uv_config(
        "flash-attn",
        "2.8.3+cu130torch2.14cxx11abiTRUE",
        "flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE-cp311-cp311-linux_x86_64.whl",
        "http://idx.example/",
        "cu130-torch2.14",
    )
    assert tomllib.loads(text)["tool"]["uv"] == {
        "index": [{"name": "attnforge-flash-attn", "url": "http://idx.example/all/simple", "explicit": True}],
        "sources": {"flash-attn": {"index": "attnforge-flash-attn"}},
    }
    assert (
        "#   uv add \"flash-attn==2.8.3+cu130torch2.14cxx11abiTRUE; sys_platform == 'linux' and "
        "platform_machine == 'x86_64'\"" in text
    )


def test_which_gives_the_uv_entries_and_never_a_yanked_wheel(index: StaticIndex) -> None:
    env = Env.from_probe(probe())
    res = resolve(env, str(index.root))
    assert res.choice is not None and res.uv is not None
    assert f'url = "{index.root.as_uri()}/all/simple"' in res.uv
    # a plain simple/ URL (not an index root): the pip command names it as given, and there are no uv entries
    plain = resolve(env, str(index.root / "all" / "simple"))
    assert plain.uv is None and plain.command is not None
    assert plain.command.endswith(f"--index-url {index.root / 'all' / 'simple'}")
    set_yanked(index, res.choice.filename, "bad")
    again = resolve(env, str(index.root))
    assert again.choice is None and again.yanked == {res.choice.filename: "bad"}
    assert f"yanked, never proposed: {res.choice.filename} (bad)" in again.explanation
    # `--torch`: the wheel for the torch the project is about to have
    other = resolve(with_torch(env, "2.13"), str(index.root))
    assert other.choice is not None and "torch2.13" in other.choice.filename
    for bad in ("2", "2.13.0+cpu", "latest"):
        with pytest.raises(ConfigurationError, match="--torch"):
            with_torch(env, bad)
