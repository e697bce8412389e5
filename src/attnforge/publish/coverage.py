"""The coverage of an index: per kernel and profile, a grid of toolkit x torch (x C++ ABI x platform) rows and
Python columns, each cell saying what exists for it.

States, from what the index holds (its records and the manifest beside each wheel) and what the matrix plans
(`coverage_plan`): `parity-passed` (the signed parity record passed when the wheel was published, the index
record's `parity: passed`; GPU, driver, date and report from the manifest's parity record), `built`
(published without a passed, signed parity run), `yanked` (with its reason), `not-built` (a valid cell of the plan with
no wheel here) and `refused` (the plan's rules and their reasons). A stable-ABI (abi3) wheel serves a range of
torch releases and Pythons: it is one row (`torch >= floor`) whose one cell spans the Python columns.

`coverage_page.CoveragePage` writes it at the root of every generation of an index (`index.html`,
`coverage.json`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from packaging.version import InvalidVersion, Version

from attnforge.names import parse_toolkit, toolkit_of_variant
from attnforge.publish.coverage_plan import PlannedCell, PlanSnapshot
from attnforge.publish.index import FileRecord, slot
from attnforge.publish.install_commands import pip_command, uv_config
from attnforge.wheels.naming import parse_local, torch_family
from attnforge.wheels.torch_checks import TorchCheck

COVERAGE_JSON = "coverage.json"
STATES = ("parity-passed", "built", "yanked", "not-built", "refused")
STATE_LABELS = {
    "parity-passed": "parity passed",
    "built": "built",
    "yanked": "yanked",
    "not-built": "not built",
    "refused": "refused by a rule",
}
STATE_HELP = {
    "parity-passed": "published, and the GPU parity suite passed on the device named",
    "built": "published, without a passed, signed GPU parity run",
    "yanked": "withdrawn (PEP 592): pip skips it unless pinned exactly, then warns with the reason",
    "not-built": "a valid cell of the matrix with no wheel in this index yet",
    "refused": "the matrix names it, but a compatibility rule refuses it (the reason is given)",
}
# where a state's entries go on the page (coverage_views): listed first with their install line, kept in the
# grid, or folded away into groups of one reason each
STATE_PLACES = {
    "parity-passed": "published",
    "built": "published",
    "yanked": "published",
    "not-built": "grid",
    "refused": "folded",
}
# what the page writes where the index's own address goes; the page's script puts its address there
INDEX_URL = "INDEX_URL"
ANY_PYTHON = "*"  # the column key of a stable-ABI row's one cell


@dataclass
class Parity:
    """A manifest's parity record, as shown."""

    passed: bool
    device: str
    driver: str | None
    date: str
    report: str
    signed: bool = True  # False: the manifest says passed; publish found no signed parity record saying so


@dataclass
class Entry:
    """One thing in a grid cell: a published wheel or a planned cell."""

    state: str
    kernel_version: str
    variant: str
    filename: str | None = None  # published wheels
    version: str | None = None
    manifest_url: str | None = None  # relative to the index root
    parity: Parity | None = None
    yanked: str | None = None
    yanked_time: str | None = None
    uploaded: str | None = None
    pip: str | None = None  # install commands, with INDEX_URL for the index's address
    uv: str | None = None
    cell_id: str | None = None  # planned cells
    reasons: list[str] = field(default_factory=list)
    abi3_python: str | None = None  # a stable-ABI wheel: the oldest CPython it serves
    # a stable-ABI wheel checked under torch releases after its build (wheels/torch_checks.py): what passed
    torch_checks: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Row:
    """A toolkit x torch (x ABI x platform) row; a stable-ABI row has one cell for every Python."""

    label: str
    stable: bool
    span_label: str = ""  # stable rows: what the one wheel serves
    cells: dict[str, list[Entry]] = field(default_factory=dict)  # python (or ANY_PYTHON) -> entries

    @property
    def states(self) -> list[str]:
        return sorted({e.state for entries in self.cells.values() for e in entries}, key=STATES.index)


@dataclass
class Section:
    """One kernel and profile: its Python columns and its rows."""

    kernel: str
    profile: str
    pythons: list[str]
    rows: list[Row]


# ---------------------------------------------------------------- where a wheel or a cell goes


@dataclass(frozen=True)
class _Slot:
    kernel: str
    profile: str
    toolkit: str
    torch: str  # family, or the floor of a stable-ABI wheel
    cxx11_abi: bool
    platform: str
    stable: bool
    arches: str  # stable rows only (their wheel names the arches)
    python: str

    @property
    def row_key(self) -> tuple[Any, ...]:
        """Rows sort per-torch before stable ABI, CUDA before ROCm, then by version, torch, ABI, platform."""
        kind, version = parse_toolkit(self.toolkit) or ("", self.toolkit)
        accel: tuple[Any, ...] = {"cuda": (0, _version(version)), "rocm": (1, _version(version))}.get(
            kind, (2, self.toolkit)
        )
        return (self.stable, accel, _version(self.torch), not self.cxx11_abi, self.platform, self.arches)

    def row_label(self) -> str:
        toolkit = _toolkit_label(self.toolkit)
        if self.stable:
            label = f"{toolkit} · {self.arches} · torch ≥ {self.torch} (stable ABI)"
        else:
            label = f"{toolkit} · torch {self.torch}"
            if not self.cxx11_abi:
                label += " · pre-cxx11 ABI"
        return label if self.platform == "x86_64" else f"{label} · {self.platform}"


def _version(text: str) -> tuple[Any, ...]:
    try:
        return (0, Version(text))
    except InvalidVersion:
        return (1, text)


def _toolkit_label(toolkit: str) -> str:
    kind, version = parse_toolkit(toolkit) or ("", "")
    return {"cuda": f"CUDA {version}", "rocm": f"ROCm {version}"}.get(kind, toolkit)


def _toolkit_of_accel(accel: str) -> str:
    return toolkit_of_variant(accel) or accel


def _published_slot(record: FileRecord, manifest: dict[str, Any]) -> _Slot:
    """Where a published wheel goes: from its manifest's inputs, else from its file name."""
    inputs = manifest.get("inputs") or {}
    local = parse_local(record.version.partition("+")[2])
    profile = str(inputs.get("profile") or (local.profile_tag if local else None) or "full")
    floor = inputs.get("torch_floor") or (local.torch_family if local and local.stable_abi else None)
    toolkit = str(inputs.get("toolkit") or (_toolkit_of_accel(local.accel) if local else "unknown"))
    torch = str(inputs.get("torch") or (local.torch_family if local else "?"))
    _, _, interp, _, machine = slot(record.filename)
    python = str(inputs.get("python") or (f"3.{interp[3:]}" if interp.startswith("cp3") else interp))
    platform = str(inputs.get("platform") or machine)
    arches = "-".join(a.replace("_", "") for a in inputs.get("arches") or (local.arches if local else ()))
    return _Slot(
        kernel=record.project,
        profile=profile,
        toolkit=toolkit,
        torch=str(floor) if floor else torch_family(torch),
        cxx11_abi=bool(inputs.get("cxx11_abi", local.cxx11_abi if local else True)),
        platform=platform,
        stable=bool(floor),
        arches=arches if floor else "",
        python=ANY_PYTHON if floor else python,
    )


def _planned_slot(cell: PlannedCell) -> _Slot:
    stable = cell.torch_floor is not None
    return _Slot(
        kernel=cell.kernel,
        profile=cell.profile,
        toolkit=cell.toolkit,
        torch=str(cell.torch_floor) if stable else torch_family(cell.torch),
        cxx11_abi=cell.cxx11_abi,
        platform=cell.platform,
        stable=stable,
        arches="-".join(a.replace("_", "") for a in cell.arches) if stable else "",
        python=ANY_PYTHON if stable else cell.python,
    )


# ---------------------------------------------------------------- entries


def _parity(manifest: dict[str, Any]) -> Parity | None:
    p = manifest.get("parity")
    if not isinstance(p, dict) or "passed" not in p:
        return None
    return Parity(
        passed=p.get("passed") is True,
        device=str(p.get("device") or "unknown device"),
        driver=str(p["driver"]) if p.get("driver") else None,
        date=str(p.get("date") or ""),
        report=str(p.get("report") or ""),
    )


def published_entry(record: FileRecord, manifest: dict[str, Any], checks: Sequence[TorchCheck] = ()) -> Entry:
    """A published wheel's entry: its state, its parity record, and the commands that install it.

    Parity passed only where publish found a signed parity record that passed (`record.parity`); the
    manifest's own `parity` (not signed) gives the details shown."""
    parity = _parity(manifest)
    if parity is not None and parity.passed and record.parity != "passed":
        parity.signed = False
    if record.yanked is not None:
        state = "yanked"
    elif parity is not None and parity.passed and parity.signed:
        state = "parity-passed"
    else:
        state = "built"
    rel = f"{quote(record.variant)}/simple/{quote(record.project)}/{quote(record.filename)}"
    entry = Entry(
        state=state,
        kernel_version=str(Version(record.version).public),
        variant=record.variant,
        filename=record.filename,
        version=record.version,
        manifest_url=rel + ".manifest.json",
        parity=parity,
        yanked=record.yanked,
        yanked_time=record.yanked_time,
        uploaded=record.upload_time,
        abi3_python=_abi3_python(record.filename, manifest),
        torch_checks=[
            {"torch": c.torch, "python": c.python, "kind": c.kind, "date": c.date} for c in checks if c.passed
        ],
    )
    if state != "yanked":  # never offered: pip would take it only pinned, and warn
        entry.pip = pip_command(record.project, record.version, INDEX_URL, record.variant)
        entry.uv = uv_config(record.project, record.version, record.filename, INDEX_URL, record.variant)
    return entry


def planned_entry(cell: PlannedCell) -> Entry:
    return Entry(
        state="refused" if cell.refused else "not-built",
        kernel_version=cell.kernel_version,
        variant=cell.variant,
        cell_id=cell.cell_id,
        reasons=list(cell.refused),
        abi3_python=cell.abi3_python,
    )


# ---------------------------------------------------------------- the grid


def build_sections(
    records: dict[str, FileRecord],
    manifests: dict[str, dict[str, Any]],
    plan: PlanSnapshot | None,
    checks: dict[str, list[TorchCheck]] | None = None,
) -> list[Section]:
    """The grid of every kernel and profile: published wheels first, planned cells where nothing is published.
    `checks`: the torch checks published beside each file (a stable-ABI row names the torch releases checked)."""
    slots: dict[_Slot, list[Entry]] = {}
    for filename in sorted(records):
        record = records[filename]
        manifest = manifests.get(filename) or {}
        entry = published_entry(record, manifest, (checks or {}).get(filename, []))
        slots.setdefault(_published_slot(record, manifest), []).append(entry)
    for cell in plan.cells if plan else []:
        if cell.served_by:  # the stable-ABI wheel another cell builds: that cell stands for it
            continue
        slot = _planned_slot(cell)
        published = slots.get(slot, [])
        if any(e.filename and e.kernel_version == cell.kernel_version for e in published):
            continue
        if any(e.cell_id == cell.cell_id for e in published):
            continue
        slots.setdefault(slot, []).append(planned_entry(cell))
    sections: dict[tuple[str, str], dict[tuple[Any, ...], tuple[_Slot, Row]]] = {}
    for slot in sorted(slots, key=lambda s: s.row_key):
        rows = sections.setdefault((slot.kernel, slot.profile), {})
        if slot.row_key not in rows:
            span = ""
            if slot.stable:
                floors = sorted({e.abi3_python for e in slots[slot] if e.abi3_python}, key=_version)
                python = f" and Python ≥ {floors[0]}" if floors else ""
                span = f"one stable-ABI (abi3) wheel for torch ≥ {slot.torch}{python}"
                checked = sorted({c["torch"] for e in slots[slot] for c in e.torch_checks}, key=_version)
                if checked:
                    span += f"; checked since its build under torch {', '.join(checked)}"
            rows[slot.row_key] = (slot, Row(label=slot.row_label(), stable=slot.stable, span_label=span))
        rows[slot.row_key][1].cells.setdefault(slot.python, []).extend(slots[slot])
    out = []
    for (kernel, profile), rows in sections.items():
        pythons = sorted(
            {py for _, row in rows.values() for py in row.cells if py != ANY_PYTHON}, key=_version
        )
        out.append(Section(kernel, profile, pythons, [row for _, row in rows.values()]))
    return sorted(out, key=_section_key)


def _section_key(section: Section) -> tuple[Any, ...]:
    """Per kernel: profiles with published wheels first, then those with the most valid cells, then by name."""
    entries = [e for row in section.rows for es in row.cells.values() for e in es]
    published = sum(1 for e in entries if e.filename)
    valid = sum(1 for e in entries if STATE_PLACES[e.state] != "folded")
    return (section.kernel, -published, -valid, section.profile)


def _abi3_python(filename: str, manifest: dict[str, Any]) -> str | None:
    """The oldest CPython a stable-ABI wheel serves: its manifest's `abi3_python`, else its `cp3X-abi3` tag."""
    inputs = manifest.get("inputs") or {}
    if inputs.get("abi3_python"):
        return str(inputs["abi3_python"])
    _, _, interp, abi, _ = slot(filename)
    return f"3.{interp[3:]}" if abi == "abi3" and interp.startswith("cp3") else None


def summary(sections: list[Section]) -> dict[str, int]:
    """How many entries each state has over the whole page."""
    counts = dict.fromkeys(STATES, 0)
    for s in sections:
        for row in s.rows:
            for entries in row.cells.values():
                for e in entries:
                    counts[e.state] += 1
    return counts
