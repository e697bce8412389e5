"""What the coverage page shows, derived from the grid (`coverage.build_sections`): the published wheels, the
rows that stay in a grid, the refused cells folded into groups of one reason each, and counts.

A state's part on the page comes from `coverage.STATE_PLACES`: `published` entries are listed first with their
install line, `folded` ones leave the grid and are grouped by reason. The renderer only lays these out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnforge.publish.coverage import ANY_PYTHON, STATE_PLACES, Entry, Row, Section


@dataclass(frozen=True)
class PublishedWheel:
    """A wheel on the index, with the grid row and the Python it sits in."""

    section: Section
    row: Row
    python: str  # a Python column, or ANY_PYTHON for a stable-ABI row
    entry: Entry

    @property
    def serves(self) -> str:
        """What it serves, in words: the row label, then its Python (or the stable-ABI range)."""
        if self.python == ANY_PYTHON:
            floor = self.entry.abi3_python
            return f"{self.row.label} · Python ≥ {floor}" if floor else f"{self.row.label} · every Python"
        return f"{self.row.label} · Python {self.python}"


@dataclass
class RefusalGroup:
    """One reason a rule gave, with every cell of a section it refuses (a cell with several reasons is in the
    group of each)."""

    reason: str  # "[rule] sentence"
    rows: dict[str, list[str]] = field(default_factory=dict)  # row label -> its Pythons (ANY_PYTHON: all)
    states: list[str] = field(default_factory=list)  # the folded states of its cells

    @property
    def rule(self) -> str:
        """The rule id of `[rule] sentence`."""
        return rule_of(self.reason)

    @property
    def count(self) -> int:
        return sum(len(pythons) for pythons in self.rows.values())


def rule_of(reason: str) -> str:
    """`torch-abi` of `[torch-abi] torch 2.9 pip wheels use ...`; `rule` when the reason names none."""
    return reason[1:].split("]")[0] if reason.startswith("[") and "]" in reason else "rule"


def _place(entry: Entry) -> str:
    return STATE_PLACES.get(entry.state, "grid")


def published_wheels(sections: list[Section]) -> list[PublishedWheel]:
    """Every wheel on the index, in grid order (sections, rows, Pythons)."""
    out = []
    for section in sections:
        for row in section.rows:
            for python in [*section.pythons, ANY_PYTHON]:
                for entry in row.cells.get(python, []):
                    if _place(entry) == "published":
                        out.append(PublishedWheel(section, row, python, entry))
    return out


def folded_count(section: Section) -> int:
    """How many entries of the section are folded away."""
    return sum(1 for row in section.rows for es in row.cells.values() for e in es if _place(e) == "folded")


def folded(row: Row) -> bool:
    """A row whose every entry is folded (refused) leaves the grid: its cells are in the refusal groups."""
    entries = [e for es in row.cells.values() for e in es]
    return bool(entries) and all(_place(e) == "folded" for e in entries)


def grid_rows(section: Section) -> list[Row]:
    """The rows a section's grid shows: those with at least one entry that is not folded."""
    return [row for row in section.rows if not folded(row)]


def refusal_groups(section: Section) -> list[RefusalGroup]:
    """The section's folded entries, one group per reason, in the order rows first meet them (refused cells of
    rows kept in the grid included: they link here)."""
    groups: dict[str, RefusalGroup] = {}
    for row in section.rows:
        for python in [*section.pythons, ANY_PYTHON]:
            for entry in row.cells.get(python, []):
                if _place(entry) != "folded":
                    continue
                for reason in entry.reasons or ["[rule] no reason recorded"]:
                    group = groups.setdefault(reason, RefusalGroup(reason))
                    pythons = group.rows.setdefault(row.label, [])
                    if python not in pythons:
                        pythons.append(python)
                    if entry.state not in group.states:
                        group.states.append(entry.state)
    return list(groups.values())
