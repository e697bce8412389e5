"""What `attnforge cache` shows of entries: JSON records and the plain cells of its tables
(the tables themselves: attnforge.cli.cache_tables)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge.cache.docker_items import DockerItem
from attnforge.cache.scan import CacheEntry
from attnforge.cache.units import format_age

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


def belongs_to(e: CacheEntry, matrix: Membership | None, flag: Callable[[str], str] = str) -> str:
    """The cells and kernel-set an entry belongs to, and its note; `flag` marks "not in the matrix"."""
    parts = []
    if e.cells:
        parts.append(e.cells[0] + (f" +{len(e.cells) - 1} more" if len(e.cells) > 1 else ""))
    if e.kernel_set:
        parts.append(f"kernel-set {e.kernel_set}")
    if matrix is not None and matrix.has(e) is False:
        parts.append(flag("not in the matrix"))
    if e.note:
        parts.append(e.note)
    return "; ".join(parts) or "-"


def age(e: CacheEntry, now: float) -> str:
    return format_age(now - e.last_used) if e.last_used else "-"


def shown(path: Path, base: Path) -> str:
    """A path relative to `base` when it lies under it (tables stay narrow)."""
    return str(path.relative_to(base)) if base in path.parents else str(path)


def docker_json(item: DockerItem) -> dict[str, Any]:
    return {
        "kind": item.kind,
        "id": item.id,
        "name": item.name,
        "bytes": item.size,
        "created": item.created,
        "garbage": item.garbage,
    }
