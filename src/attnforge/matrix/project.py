"""The project a command works on: matrix.yaml, its lock file and the compat tables, loaded once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from attnforge.matrix.compat import CompatData, load_compat
from attnforge.matrix.file import load_matrix
from attnforge.matrix.plan import Plan, plan_target
from attnforge.matrix.schema import Matrix
from attnforge.matrix.source_lock import LOCK_FILE, read_lock


@dataclass
class Project:
    """Paths given on the command line; everything else is derived and loaded lazily."""

    matrix_path: Path
    compat_path: str | None = None

    @property
    def root(self) -> Path:
        return self.matrix_path.resolve().parent

    @cached_property
    def matrix(self) -> Matrix:
        return load_matrix(self.matrix_path)

    @cached_property
    def compat(self) -> CompatData:
        return load_compat(self.compat_path)

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_FILE

    @cached_property
    def lock(self) -> dict[str, Any]:
        return read_lock(self.lock_path)

    def plan(self, target: str) -> Plan:
        return plan_target(self.matrix, target, self.compat, self.lock)

    def path(self, relative: str) -> Path:
        """A path from matrix.yaml (relative to the matrix file's folder)."""
        p = Path(relative)
        return p if p.is_absolute() else self.root / p
