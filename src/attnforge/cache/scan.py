"""What the cache holds: one entry per removable unit, with its size, last use and owners.

Layout (written by engine/run.py, engine/sources.py and the builder):

    <cache>/sources/<sdist>                      downloaded kernel sdists
    <cache>/venvs/<cpXY>-torch<T>-<variant>[.lock] torch venvs per (Python, torch)
    <cache>/cells/<kernel-set key>/<cpXY>-torch<T>/  a cell's build tree (tree/, out/, spec.json)
    <cache>/cells/<kernel-set key>/objects/      compiled kernel objects shared by a kernel-set
    <cache>/ccache/                              ccache (when a build turns it on)
    <cache>/tests/<item>                         the test suite's kept venvs, sdists and wheels
                                                 ($ATTNFORGE_TEST_CACHE's default)
    <cache>/job_memory.json, unit_times.json     measured job memory and unit compile times (kept)
    <cache>/.build.lock                          the build lock (kept)
    <output>/logs/*.log                          build logs
    <output>/.staging-*, .finalized-*            leftovers of an interrupted finalize

Last use is the newest change (mtime) of anything inside, or the newest `spec.json` that names the
entry: a build rewrites its cell's spec on every run, which dates the venv, sdist and kernel objects it
used without writing to them. Access times are not used: reading files (this scan reads spec.json and
manifest.json; backups and greps read more) would make an entry look used.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from attnforge.builder.exits import BuildFailure
from attnforge.builder.spec import BuildSpec
from attnforge.cache.build_lock import LOCK_NAME

TRASH_SUFFIX = ".attnforge-trash"  # an entry being removed (renamed first, then deleted)
KEPT_KINDS = frozenset({"state", "other"})
STATE_FILES = frozenset({"job_memory.json", "unit_times.json", LOCK_NAME})


@dataclass
class CacheEntry:
    """One removable unit of the cache."""

    kind: str  # source, venv, build-tree, objects, ccache, test, log, staging, trash, state, other
    path: Path
    size: int = 0  # bytes on disk (allocated blocks; a hard-linked file counts once)
    last_used: float = 0.0  # epoch seconds
    cells: list[str] = field(default_factory=list)  # cell ids known to use it
    kernel_set: str | None = None
    extra: list[Path] = field(default_factory=list)  # removed with it (a venv's lock file)
    note: str = ""

    @property
    def prunable(self) -> bool:
        return self.kind not in KEPT_KINDS


@dataclass
class _Use:
    cells: list[str] = field(default_factory=list)
    last: float = 0.0


class _Walker:
    """Disk usage and newest mtime of files and trees; hard links are counted once per scan."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()

    def usage(self, path: Path) -> tuple[int, float]:
        size, newest = 0, 0.0
        stack = [path]
        while stack:
            p = stack.pop()
            try:
                st = p.lstat()
            except OSError:
                continue  # removed meanwhile
            newest = max(newest, st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                with contextlib.suppress(OSError):
                    stack.extend(Path(e.path) for e in os.scandir(p))
                size += st.st_blocks * 512
                continue
            if st.st_nlink > 1:
                if (st.st_dev, st.st_ino) in self.seen:
                    continue
                self.seen.add((st.st_dev, st.st_ino))
            size += st.st_blocks * 512
        return size, newest


def _children(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _spec_uses(cache: Path) -> dict[Path, _Use]:
    """Every path a cell's spec.json names -> the cells and the newest spec time."""
    uses: dict[Path, _Use] = {}
    for spec_path in sorted(cache.glob("cells/*/*/spec.json")):
        try:
            spec = BuildSpec.load(spec_path)
            when = spec_path.stat().st_mtime
        except (OSError, BuildFailure):
            continue
        cell = spec.cell_id
        named = [spec_path.parent, *spec.shared_paths()]
        for p in named:
            use = uses.setdefault(p, _Use())
            if cell and cell not in use.cells:
                use.cells.append(cell)
            use.last = max(use.last, when)
    return uses


def _cache_entries(cache: Path) -> list[CacheEntry]:
    entries: list[CacheEntry] = []
    for p in _children(cache):
        if p.name == "sources" and p.is_dir():
            for f in _children(p):
                note = "partial download" if f.name.endswith(".part") else ""
                entries.append(CacheEntry("source", f, note=note))
        elif p.name == "venvs" and p.is_dir():
            entries += _venv_entries(p)
        elif p.name == "cells" and p.is_dir():
            for group in _children(p):
                entries += _cell_group_entries(group)
        elif p.name == "ccache" and p.is_dir():
            entries.append(CacheEntry("ccache", p, note="shared by every cell"))
        elif p.name == "tests" and p.is_dir():
            entries += [CacheEntry("test", t, note="kept by the test suite") for t in _children(p)]
        elif p.name.endswith(TRASH_SUFFIX):
            entries.append(CacheEntry("trash", p, note="an interrupted prune"))
        elif p.name in STATE_FILES:
            entries.append(CacheEntry("state", p))
        else:
            entries.append(CacheEntry("other", p, note="not attnforge's layout: kept"))
    return entries


def _venv_entries(venvs: Path) -> list[CacheEntry]:
    entries: dict[str, CacheEntry] = {}
    locks: list[Path] = []
    for p in _children(venvs):
        if p.name.endswith(TRASH_SUFFIX):
            entries[p.name] = CacheEntry("trash", p, note="an interrupted prune")
        elif p.is_dir():
            entries[p.name] = CacheEntry("venv", p)
        elif p.name.endswith(".lock"):
            locks.append(p)
        else:
            entries[p.name] = CacheEntry("other", p, note="not attnforge's layout: kept")
    for lock in locks:
        owner = entries.get(lock.name.removesuffix(".lock"))
        if owner is not None and owner.kind == "venv":
            owner.extra.append(lock)
        else:
            entries[lock.name] = CacheEntry("venv", lock, note="lock file of a removed venv")
    return list(entries.values())


def _cell_group_entries(group: Path) -> list[CacheEntry]:
    if not group.is_dir():
        return [CacheEntry("other", group, note="not attnforge's layout: kept")]
    key = group.name
    entries: list[CacheEntry] = []
    for p in _children(group):
        if p.name.endswith(TRASH_SUFFIX):
            entries.append(CacheEntry("trash", p, kernel_set=key, note="an interrupted prune"))
        elif p.name == "objects":
            entries.append(CacheEntry("objects", p, kernel_set=key, cells=_objects_creator(p)))
        elif p.name.startswith("objects.tmp"):
            entries.append(CacheEntry("objects", p, kernel_set=key, note="unfinished save"))
        elif p.is_dir():
            entries.append(CacheEntry("build-tree", p, kernel_set=key))
        else:
            entries.append(CacheEntry("other", p, kernel_set=key, note="not attnforge's layout: kept"))
    return entries


def _objects_creator(objects: Path) -> list[str]:
    try:
        created_by = json.loads((objects / "manifest.json").read_text()).get("created_by")
    except (OSError, ValueError, AttributeError):
        return []
    return [str(created_by)] if created_by else []


def _output_entries(output: Path) -> list[CacheEntry]:
    entries: list[CacheEntry] = []
    for log in sorted((output / "logs").glob("*.log")):
        if log.name.startswith("builder-"):
            entries.append(CacheEntry("log", log, note="builder image log"))
        else:
            entries.append(CacheEntry("log", log, cells=[log.name.removesuffix(".log")]))
    for p in _children(output):
        if p.is_dir() and p.name.startswith((".staging-", ".finalized-")):
            entries.append(CacheEntry("staging", p, note="left by an interrupted build"))
    return entries


def scan(cache: Path, output: Path | None = None) -> list[CacheEntry]:
    """Every entry of the cache (and the logs and leftovers in the output folder), sized and dated."""
    entries = _cache_entries(cache) if cache.is_dir() else []
    if output is not None and output.is_dir():
        entries += _output_entries(output)
    uses = _spec_uses(cache) if cache.is_dir() else {}
    walker = _Walker()
    for e in entries:
        size, newest = 0, 0.0
        for p in [e.path, *e.extra]:
            s, n = walker.usage(p)
            size, newest = size + s, max(newest, n)
        e.size = size
        use = uses.get(e.path)
        e.last_used = 0.0 if e.kind == "trash" else max(newest, use.last if use else 0.0)
        for cell in use.cells if use else []:
            if cell not in e.cells:
                e.cells.append(cell)
    return entries
