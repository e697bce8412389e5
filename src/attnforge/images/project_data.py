"""The project's matrix and compat data for image commands, which also work without them (e.g. `pull` on a
machine with no matrix.yaml): None when the file is missing or invalid, with a note."""

from __future__ import annotations

from collections.abc import Callable

from attnforge.core.errors import ConfigurationError
from attnforge.matrix.compat import CompatData
from attnforge.matrix.project import Project
from attnforge.matrix.schema import Matrix

Log = Callable[[str], None]


def _note(what: str, exc: ConfigurationError, log: Log) -> None:
    log(f"note: no {what} data ({exc}); going on without it")


def optional_matrix(project: Project, log: Log) -> Matrix | None:
    """project.matrix, or None when the file is missing or invalid (logged)."""
    try:
        return project.matrix
    except ConfigurationError as exc:
        _note("matrix", exc, log)
        return None


def optional_compat(project: Project, log: Log) -> CompatData | None:
    """project.compat, or None when the data is missing or invalid (logged)."""
    try:
        return project.compat
    except ConfigurationError as exc:
        _note("compat", exc, log)
        return None
