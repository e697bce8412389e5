"""The packaged compat tables without what torch 2.15 brought (its [[torch]] row, CPython 3.15, CUDA 13.2): the
table `compat refresh` is tested against, and the one the index snapshot was recorded with
(`python -m tests.unit.compat_reduced OUT`, then `attnforge compat refresh --compat OUT --record ...`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from attnforge.matrix.compat import packaged_tables
from attnforge.matrix.compat_refresh.overlay_file import render

DROPPED = {"torch": ("family", "2.15"), "python": ("version", "3.15"), "cuda": ("version", "13.2")}


def reduced_tables() -> dict[str, Any]:
    """The packaged tables minus the rows in DROPPED, marked standalone."""
    tables = packaged_tables()
    for table, (key, value) in DROPPED.items():
        tables[table] = [r for r in tables[table] if r.get(key) != value]
    tables["meta"] = {"standalone": True}
    return tables


def write_reduced(path: Path) -> Path:
    path.write_text(render(reduced_tables()))
    return path


if __name__ == "__main__":
    write_reduced(Path(sys.argv[1]))
