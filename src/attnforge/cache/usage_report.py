"""How `attnforge cache` shows entries: JSON records and rich tables."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from attnforge.cache.docker_items import DockerItem
from attnforge.cache.scan import CacheEntry
from attnforge.cache.units import format_age, format_size

KIND_ORDER = (
    "source",
    "venv",
    "build-tree",
    "objects",
    "ccache",
    "test",
    "log",
    "staging",
    "trash",
    "state",
    "other",
)


@dataclass(frozen=True)
class Membership:
    """Cell ids and kernel-set keys of the current matrix (every target)."""

    cells: frozenset[str]
    kernel_sets: frozenset[str]

    def has(self, entry: CacheEntry) -> bool | None:
        """Whether the matrix still has the entry's kernel-set or one of its cells (None: not known)."""
        if entry.kernel_set:
            return entry.kernel_set in self.kernel_sets
        if entry.cells:
            return any(c in self.cells for c in entry.cells)
        return None


def _iso(ts: float) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds") if ts else None


def entry_json(e: CacheEntry, now: float, matrix: Membership | None) -> dict[str, Any]:
    return {
        "kind": e.kind,
        "path": str(e.path),
        "bytes": e.size,
        "last_used": _iso(e.last_used),
        "age_s": round(now - e.last_used) if e.last_used else None,
        "cells": e.cells,
        "kernel_set": e.kernel_set,
        "in_matrix": matrix.has(e) if matrix else None,
        "prunable": e.prunable,
        "note": e.note,
    }


def ordered(entries: list[CacheEntry]) -> list[CacheEntry]:
    """By kind (KIND_ORDER), the largest first within a kind."""
    return sorted(entries, key=lambda e: (KIND_ORDER.index(e.kind), -e.size, str(e.path)))


def by_kind(entries: list[CacheEntry]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for kind in KIND_ORDER:
        of_kind = [e for e in entries if e.kind == kind]
        if of_kind:
            out[kind] = {"entries": len(of_kind), "bytes": sum(e.size for e in of_kind)}
    return out


def belongs_to(e: CacheEntry, matrix: Membership | None) -> str:
    parts = []
    if e.cells:
        parts.append(e.cells[0] + (f" +{len(e.cells) - 1} more" if len(e.cells) > 1 else ""))
    if e.kernel_set:
        parts.append(f"kernel-set {e.kernel_set}")
    if matrix is not None and matrix.has(e) is False:
        parts.append("[yellow]not in the matrix[/]")
    if e.note:
        parts.append(e.note)
    return "; ".join(parts) or "-"


def age(e: CacheEntry, now: float) -> str:
    return format_age(now - e.last_used) if e.last_used else "-"


def shown(path: Path, base: Path) -> str:
    """A path relative to `base` when it lies under it (tables stay narrow)."""
    return str(path.relative_to(base)) if base in path.parents else str(path)


def entries_table(entries: list[CacheEntry], now: float, matrix: Membership | None, base: Path) -> Table:
    table = Table(title=f"cache entries (paths relative to {base})")
    for col, justify in (("kind", "left"), ("entry", "left"), ("size", "right"), ("last used", "right")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    table.add_column("belongs to", overflow="fold")
    for e in entries:
        table.add_row(e.kind, shown(e.path, base), format_size(e.size), age(e, now), belongs_to(e, matrix))
    return table


def kinds_table(entries: list[CacheEntry], now: float) -> Table:
    table = Table(title="by kind")
    for col in ("kind", "entries", "size", "newest use", "oldest use"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for kind, row in by_kind(entries).items():
        used = [e.last_used for e in entries if e.kind == kind and e.last_used]
        newest = format_age(now - max(used)) if used else "-"
        oldest = format_age(now - min(used)) if used else "-"
        table.add_row(kind, str(row["entries"]), format_size(row["bytes"]), newest, oldest)
    total = sum(e.size for e in entries)
    table.add_row("[bold]total[/]", str(len(entries)), f"[bold]{format_size(total)}[/]", "", "")
    return table


def docker_json(item: DockerItem) -> dict[str, Any]:
    return {
        "kind": item.kind,
        "id": item.id,
        "name": item.name,
        "bytes": item.size,
        "created": item.created,
        "garbage": item.garbage,
    }


def docker_table(items: list[DockerItem]) -> Table:
    table = Table(title="Docker (attnforge images and build containers)")
    for col in ("kind", "id", "name", "size", "created", "prune --docker"):
        table.add_column(col, overflow="fold")
    for i in items:
        gone = "removes" if i.garbage else "keeps"
        table.add_row(i.kind, i.id, i.name, format_size(i.size) if i.size else "-", i.created, gone)
    return table
