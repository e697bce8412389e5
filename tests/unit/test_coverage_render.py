"""The coverage page at release size, from a synthetic plan of 1,000 cells (most refused) and a few published
wheels: what comes first, what is folded and how refusals are grouped, the page's weight, and what a browser
without scripts (or a screen reader's raw view) gets."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest

from attnforge.publish.coverage import STATES, build_sections, summary
from attnforge.publish.coverage_grid_html import merge_labels
from attnforge.publish.coverage_html import render_page
from attnforge.publish.coverage_plan import PlannedCell, PlanSnapshot
from attnforge.publish.coverage_views import folded, grid_rows, published_wheels, refusal_groups
from attnforge.publish.index import ALL, FileRecord

TOOLKITS = [
    "cuda12.1",
    "cuda12.2",
    "cuda12.3",
    "cuda12.4",
    "cuda12.5",
    "cuda12.6",
    "cuda12.8",
    "cuda12.9",
    "cuda13.0",
]
TORCHES = ["2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15"]
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14"]
BUDGET = 200_000  # bytes: the page of a release-size plan


def _reasons(toolkit: str, torch: str, python: str, abi: bool) -> tuple[str, ...]:
    """Rules in the manner of the shipped compat data: old toolkits for new torch, one ABI per torch, no 3.14
    before torch 2.9."""
    out = []
    minor = int(torch.split(".")[1])
    if minor >= 7 and toolkit < "cuda12.6":
        out.append(
            f"[torch-toolkit] torch {torch}'s oldest CUDA 12 build is 12.6, newer than the toolkit "
            f"{toolkit[4:]}: compile with CUDA >= 12.6"
        )
    if abi != (minor >= 7):
        out.append(
            f"[torch-abi] torch {torch} pip wheels use cxx11abi={'TRUE' if minor >= 7 else 'FALSE'} only"
        )
    if python == "3.14" and minor < 9:
        out.append(f"[torch-python] torch {torch} has no wheels for Python 3.14")
    return tuple(out)


def _cell(toolkit: str, torch: str, python: str, abi: bool, profile: str = "full") -> PlannedCell:
    tag = toolkit.replace("cuda", "cu").replace(".", "")
    cid = f"flash-attn-2.8.3-{tag}-torch{torch}.0-cp{python.replace('.', '')}-abi{int(abi)}-sm80-sm90-{profile}-x86_64"
    return PlannedCell(
        cell_id=cid,
        target="release",
        kernel="flash-attn",
        kernel_version="2.8.3",
        profile=profile,
        toolkit=toolkit,
        torch=f"{torch}.0",
        python=python,
        cxx11_abi=abi,
        platform="x86_64",
        arches=("sm_80", "sm_90"),
        variant=f"{tag}-torch{torch}",
        wheel=f"flash_attn-2.8.3+{tag}torch{torch}cxx11abi{str(abi).upper()}-cp{python[2:]}-x86_64.whl",
        refused=_reasons(toolkit, torch, python, abi),
    )


def plan_1000() -> PlanSnapshot:
    """990 cells of a release-like grid (9 toolkits x 11 torch x 5 Python x 2 ABIs) and 10 of a ROCm-like
    profile that sorts first by name."""
    cells = [
        _cell(tk, t, py, abi) for tk in TOOLKITS for t in TORCHES for py in PYTHONS for abi in (True, False)
    ]
    cells += [_cell("cuda13.0", t, py, True, "aaa") for t in ("2.13", "2.14") for py in PYTHONS]
    assert len(cells) == 1000
    return PlanSnapshot("matrix.yaml", cells, [])


def record(torch: str, python: str, *, yanked: str | None = None, parity: str = "none") -> FileRecord:
    version = f"2.8.3+cu130torch{torch}cxx11abiTRUE"
    return FileRecord(
        filename=f"flash_attn-{version}-cp{python[2:]}-cp{python[2:]}-linux_x86_64.whl",
        project="flash-attn",
        version=version,
        variant=f"cu130-torch{torch}",
        sha256="0" * 64,
        size=1,
        metadata_sha256="0" * 64,
        requires_python=None,
        upload_time="2026-11-20T10:00:00Z",
        parity=parity,
        yanked=yanked,
    )


def manifest(torch: str, python: str, passed: bool = False) -> dict[str, Any]:
    inputs = {"toolkit": "cuda13.0", "torch": f"{torch}.0", "python": python, "profile": "full"}
    inputs.update(cxx11_abi=True, platform="x86_64", arches=["sm_80", "sm_90"])
    out: dict[str, Any] = {"inputs": inputs}
    if passed:
        out["parity"] = {"passed": True, "device": "NVIDIA H100", "date": "2026-11-20", "report": ""}
    return out


@pytest.fixture(scope="module")
def page_and_sections() -> tuple[str, list[Any]]:
    published = {
        ("2.14", "3.12"): record("2.14", "3.12", parity="passed"),
        ("2.13", "3.11"): record("2.13", "3.11"),
        ("2.12", "3.11"): record("2.12", "3.11", yanked="wrong results for causal masks"),
    }
    records = {r.filename: r for r in published.values()}
    manifests = {r.filename: manifest(t, py, passed=r.parity == "passed") for (t, py), r in published.items()}
    sections = build_sections(records, manifests, plan_1000())
    return render_page(sections, [ALL, *sorted({r.variant for r in records.values()})], "now", []), sections


def test_published_wheels_and_counts_come_first(page_and_sections: tuple[str, list[Any]]) -> None:
    page, sections = page_and_sections
    h2 = re.findall(r"<h2 id=\"[^\"]+\">([^<]+)</h2>", page)
    assert h2 == ["Published wheels", "Counts per state", "Contents", "Coverage grids", "Variant indexes"]
    wheels = published_wheels(sections)
    assert [w.entry.state for w in wheels] == ["yanked", "built", "parity-passed"]  # grid order: by torch
    first = page.index('<section id="published"')
    assert (
        first
        < page.index('<section id="counts"')
        < page.index('id="toc"')
        < page.index('<section id="grids"')
    )
    published = page[first : page.index('<section id="counts"')]
    # each wheel: its version, what it serves, its state, and pip's line for its variant (not for the yanked one)
    assert (
        "pip install flash-attn==2.8.3+cu130torch2.14cxx11abiTRUE --index-url INDEX_URL/cu130-torch2.14/simple"
        in re.sub(r"<[^>]+>", "", published)  # the text, tags away
    )
    assert "CUDA 13.0 · torch 2.14 · Python 3.12" in published
    assert "Parity passed on NVIDIA H100" in published
    assert "Reason: wrong results for causal masks" in published and "Not offered: yanked." in published
    assert published.count('<pre><code class="cmd" data-cmd="pip"') == 2
    counts = summary(sections)
    assert counts["refused"] > 500 and sum(counts.values()) == 1000  # each wheel took its cell's place
    for state in STATES:  # every count, linked to the grid filtered to it
        assert f'href="?state={state}#grids"' in page and f'<span class="n">{counts[state]}</span>' in page
    # a profile with a published wheel comes before one that sorts first by name
    assert [(s.kernel, s.profile) for s in sections] == [("flash-attn", "full"), ("flash-attn", "aaa")]


def test_refused_cells_are_folded_into_one_group_per_reason(page_and_sections: tuple[str, list[Any]]) -> None:
    page, sections = page_and_sections
    full = sections[0]
    kept = grid_rows(full)
    assert kept and all(not folded(r) for r in kept) and len(kept) < len(full.rows) / 2
    groups = refusal_groups(full)
    reasons = {r for row in full.rows for es in row.cells.values() for e in es for r in e.reasons}
    assert {g.reason for g in groups} == reasons  # every reason once, each with its cells
    abi = next(g for g in groups if g.reason.startswith("[torch-abi] torch 2.5 "))
    assert abi.count == 9 * 5  # every toolkit and Python of the cxx11 ABI row of torch 2.5
    # the page: a closed <details> per grid, a list item per reason, rows merged (`CUDA 12.1, 12.2 · ...`)
    assert page.count('<details class="refusals"') == 1 and '<details class="refusals" open' not in page
    assert page.count('<li class="group"') == len(groups) < summary(sections)["refused"] / 8
    assert (
        "Python 3.10, 3.11, 3.12, 3.13, 3.14: CUDA 12.1, 12.2, 12.3, 12.4, 12.5, 12.6, 12.8, 12.9, 13.0 · torch 2.5</li>"
        in page
    )
    # a refused cell left in a kept row links to its reason's group
    anchor = re.search(
        r'<div class="entry state-refused"><strong class="state">refused<span class="sr-only"> by a rule</span>'
        r"</strong>: "
        r'<a href="#(r1-\d+)">',
        page,
    )
    assert anchor and f'<li class="group" id="{anchor.group(1)}" data-states="refused">' in page


def test_merge_labels_writes_shared_tails_once() -> None:
    assert merge_labels(["CUDA 12.1 · torch 2.5", "CUDA 12.2 · torch 2.5", "ROCm 6.4 · torch 2.5", "x"]) == [
        "CUDA 12.1, 12.2 · torch 2.5",
        "ROCm 6.4 · torch 2.5",
        "x",
    ]


def test_the_page_of_1000_cells_stays_within_its_budget(page_and_sections: tuple[str, list[Any]]) -> None:
    page, _ = page_and_sections
    size = len(page.encode("utf-8"))
    assert size <= BUDGET, f"{size} bytes"
    # no cell's long build command repeats outside the grid's kept rows (what keeps it small)
    assert page.count("attnforge build --cell") == summary(page_and_sections[1])["not-built"]


class Outline(HTMLParser):
    """What a no-script reader meets: headings, tables with captions and scoped headers, closed details, text."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[tuple[str, str]] = []
        self.tables = self.captions = self.details = self.summaries = 0
        self.scopes: set[str | None] = set()
        self.ids: set[str] = set()
        self.hrefs: set[str] = set()
        self._in: str | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "a" and str(a.get("href", "")).startswith("#"):
            self.hrefs.add(str(a["href"])[1:])
        if tag in ("h1", "h2", "h3"):
            self._in = tag
        self.tables += tag == "table"
        self.captions += tag == "caption"
        self.details += tag == "details"
        self.summaries += tag == "summary"
        if tag == "th":
            self.scopes.add(a.get("scope"))

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in:
            self.headings.append((self._in, data))
        self.text.append(data)


def test_without_scripts_everything_is_text_headings_and_details(
    page_and_sections: tuple[str, list[Any]],
) -> None:
    page, sections = page_and_sections
    outline = Outline()
    outline.feed(page)
    assert [h for h in outline.headings if h[0] == "h3"] == [
        ("h3", "flash-attn · profile full"),
        ("h3", "flash-attn · profile aaa"),
    ]
    assert outline.tables == outline.captions == 3  # the published wheels, two grids
    assert outline.scopes == {"col", "row"}
    assert outline.details == outline.summaries  # every folded part opens from its summary
    assert outline.hrefs <= outline.ids  # every in-page link lands (contents, wheels, refusal groups)
    text = " ".join(outline.text)
    for group in refusal_groups(sections[0]):  # every reason's sentence is on the page, folded, not missing
        assert group.reason.partition("] ")[2] in text
    assert '<form id="filters" role="search" aria-label="Filter the grids" hidden>' in page
    assert (
        '<label for="filter-text">Search</label>' in page
        and '<label for="filter-state">State</label>' in page
    )


def test_an_index_with_no_wheel_and_no_plan_says_so() -> None:
    page = render_page([], [ALL], "now", [])
    assert (
        "No wheel is published here yet" in page and "The index holds no wheels yet and has no plan." in page
    )
    assert "<ol></ol>" not in page and "<table" not in page
