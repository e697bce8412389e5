"""What `compat refresh` found: rows to add or change (with the facts read and their source), releases seen
whose row cannot be established from the index (said, never guessed), and notes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["new", "changed", "unestablished", "note"]


@dataclass
class Finding:
    """One row's verdict: `row` is the complete row to write for new/changed."""

    table: str
    key: str
    kind: Kind
    summary: str
    row: dict[str, Any] = field(default_factory=dict)
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # field -> (in use, on the index)

    @property
    def moved(self) -> bool:
        """Upstream moved: a row would be added or changed, or a new release has no row yet."""
        return self.kind != "note"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "table": self.table,
            "key": self.key,
            "kind": self.kind,
            "summary": self.summary,
        }
        if self.changes:
            out["changes"] = {k: {"in_use": a, "index": b} for k, (a, b) in self.changes.items()}
        if self.row:
            out["row"] = self.row
        return out


@dataclass
class Report:
    """Every finding of one refresh, and where the index was read."""

    index: str
    date: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def moved(self) -> bool:
        return any(f.moved for f in self.findings)

    def writable(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in ("new", "changed")]

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "date": self.date,
            "moved": self.moved,
            "findings": [f.as_json() for f in self.findings],
        }

    def text(self) -> str:
        lines = [f"package index: {self.index}, read {self.date}"]
        if not self.findings:
            lines.append("nothing new: the compat data in use matches the index")
        for f in self.findings:
            lines.append(f"{f.kind:>13}  [[{f.table}]] {f.key}: {f.summary}")
            for name, (old, new) in f.changes.items():
                lines.append(f"{'':15}{name}: {old!r} -> {new!r}")
        return "\n".join(lines)
