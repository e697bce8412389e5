"""Choosing and removing cache entries: old ones first (--older-than), then least recently used (--max-size)."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from attnforge.cache.holders import overlaps
from attnforge.cache.scan import TRASH_SUFFIX, CacheEntry


@dataclass
class PrunePlan:
    """What goes (oldest first), what stays because a running build holds it, and the size afterwards."""

    remove: list[CacheEntry] = field(default_factory=list)
    held: list[CacheEntry] = field(default_factory=list)
    total_before: int = 0

    @property
    def freed(self) -> int:
        return sum(e.size for e in self.remove)

    @property
    def total_after(self) -> int:
        return self.total_before - self.freed


def is_held(entry: CacheEntry, held_paths: set[Path], held_cells: set[str]) -> bool:
    """True when a running builder uses the entry (a path of its spec, or its cell's log)."""
    if overlaps(entry.path, held_paths):
        return True
    return entry.kind == "log" and any(c in held_cells for c in entry.cells)


def plan_prune(
    entries: list[CacheEntry],
    *,
    now: float,
    max_size: int | None = None,
    older_than: float | None = None,
    held_paths: set[Path] | None = None,
    held_cells: set[str] | None = None,
) -> PrunePlan:
    """Trash goes; entries unused for `older_than` seconds go; then the least recently used until the total
    is at most `max_size` bytes. Kept kinds (state, other) and entries a running builder holds never go."""
    plan = PrunePlan(total_before=sum(e.size for e in entries))
    candidates: list[CacheEntry] = []
    for e in sorted((e for e in entries if e.prunable), key=lambda e: (e.last_used, str(e.path))):
        if is_held(e, held_paths or set(), held_cells or set()):
            plan.held.append(e)
        else:
            candidates.append(e)
    plan.remove += [e for e in candidates if e.kind == "trash"]  # half-removed already: always
    if older_than is not None:
        plan.remove += [e for e in candidates if now - e.last_used > older_than and e not in plan.remove]
    if max_size is not None:
        total = plan.total_after
        for e in candidates:
            if total <= max_size:
                break
            if e not in plan.remove:
                plan.remove.append(e)
                total -= e.size
    plan.remove.sort(key=lambda e: (e.last_used, str(e.path)))
    return plan


def remove_entry(entry: CacheEntry) -> None:
    """Delete an entry. A folder is renamed aside first, so a build never finds it half deleted (an
    interrupted removal leaves `<name>.attnforge-trash`, which the next prune removes)."""
    for extra in entry.extra:
        extra.unlink(missing_ok=True)
    path = entry.path
    if path.is_dir() and not path.is_symlink():
        if not path.name.endswith(TRASH_SUFFIX):
            trash = path.with_name(f"{path.name}.{os.getpid()}{TRASH_SUFFIX}")
            path.rename(trash)
            path = trash
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def remove_empty_kernel_set(entry: CacheEntry) -> None:
    """Remove the kernel-set folder (`cells/<key>`) once its last tree and objects are gone."""
    parent = entry.path.parent
    if entry.kernel_set and parent.name == entry.kernel_set:
        with contextlib.suppress(OSError):  # not empty
            parent.rmdir()
