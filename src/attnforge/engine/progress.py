"""Progress of cell builds: what the engine reports (stages, compiled units, log lines) and to whom.

The engine and its backends report to a `ProgressView` (a protocol, no rendering library): the CLI's view
(`attnforge.cli.progress_view`) draws a live table on a terminal and sparse plain lines in CI logs.
`ProgressBoard` holds the per-cell state and decides the CI lines; `PlainProgressView` writes those lines
as they are (library callers, tests).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Protocol, TextIO

from attnforge.engine.schedule import plan_eta

LogLevel = Literal["info", "warning", "error"]


class ProgressView(Protocol):
    """Where the engine reports progress; thread-safe (cells build in parallel)."""

    def log(self, message: str, level: LogLevel = "info") -> None:
        """A line that stays (also in quiet mode); `message` is plain text, never markup."""

    def stage(
        self, cell_id: str, stage: str, status: str | None = None, seconds: float | None = None
    ) -> None:
        """A cell's stage; `status`/`seconds` are the builder's stage event fields when the caller has them."""

    def plan_units(self, cell_id: str, order: list[tuple[str, float]], jobs: int) -> None:
        """The units a compile starts, in order, with estimated seconds (from the unit-time table)."""

    def units(self, cell_id: str, done: int, total: int, name: str | None = None) -> None:
        """`done` of `total` units compiled; `name` is the unit that just finished."""


@dataclass
class CellProgress:
    """What the view shows for one cell."""

    cell_id: str
    stage: str = "queued"
    done: int = 0
    total: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    last_printed_pct: int = -1
    open_stage: str | None = None  # a builder stage that started and has not ended yet
    open_since: float = 0.0
    plan: list[tuple[str, float]] = field(default_factory=list)  # units in start order, estimated seconds
    plan_jobs: int = 1
    compile_started: float | None = None
    unit_ends: dict[str, float] = field(default_factory=dict)  # unit stem -> seconds after compile start

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def eta(self) -> str:
        """Time left: the unit-time table's plan for this compile (`schedule.plan_eta`), else by rate."""
        if self.finished is not None or (self.total > 0 and self.done >= self.total):
            return "-"
        if self.plan and self.compile_started is not None:
            left = plan_eta(
                self.plan, self.plan_jobs, self.unit_ends, time.monotonic() - self.compile_started
            )
            return f"{left:.0f}s"
        if self.total <= 0 or self.done <= 0:
            return "-"
        rate = self.elapsed / self.done
        return f"{rate * (self.total - self.done):.0f}s"


# The builder's stages (builder/report.py): each sends a start event and then a done or failed event.
BUILDER_STAGES = frozenset({"source", "unpack", "venv", "compiler", "compile", "import_check"})
END_STATES = frozenset({"done", "failed", "skipped", "cancelled"})


def plain_stage_line(p: CellProgress, stage: str, status: str | None, seconds: float | None) -> str | None:
    """The CI line for a stage event, or None: a builder stage prints once, when it ends, with its time.

    `status` is the builder's (start, done, failed); without it a builder stage's second event is its end.
    Other stages (the engine's own: fetching sources, building, finalizing, done...) print as they come.
    """
    now = time.monotonic()
    if stage not in BUILDER_STAGES:
        return stage
    ending = status in ("done", "failed") if status else p.open_stage == stage
    if not ending:
        p.open_stage, p.open_since = stage, now
        return None
    if seconds is None:
        seconds = now - p.open_since if p.open_stage == stage else 0.0
    p.open_stage = None
    return f"{stage} {status or 'ended'} ({seconds:.0f}s)"


def interactive() -> bool:
    """A live view only on a terminal and outside CI."""
    return sys.stderr.isatty() and not os.environ.get("CI")


class ProgressBoard:
    """The state of every cell, kept under a lock; in quiet mode the events CI should see become lines.

    A `ProgressView` for subclasses: they print the lines (`emit`) and may redraw on each change (`refresh`).
    """

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.cells: dict[str, CellProgress] = {}
        self._lock = threading.Lock()

    def emit(self, line: str, level: LogLevel = "info") -> None:
        """Print one line (plain text)."""
        raise NotImplementedError

    def refresh(self) -> None:
        """Redraw after a change (a live view); nothing by default."""

    def log(self, message: str, level: LogLevel = "info") -> None:
        """A line that stays (also in quiet mode)."""
        self.emit(message, level)

    def stage(
        self, cell_id: str, stage: str, status: str | None = None, seconds: float | None = None
    ) -> None:
        """A cell's stage; `status`/`seconds` are the builder's stage event fields when the caller has them."""
        with self._lock:
            p = self.cells.setdefault(cell_id, CellProgress(cell_id))
            p.stage = stage
            if stage in END_STATES:
                p.finished = time.monotonic()
            line = plain_stage_line(p, stage, status, seconds) if self.quiet else None
            if line:
                self.emit(f"[{p.elapsed:6.0f}s] {cell_id}: {line}")
            self.refresh()

    def plan_units(self, cell_id: str, order: list[tuple[str, float]], jobs: int) -> None:
        """The units a compile starts, in order, with estimated seconds (from the unit-time table)."""
        with self._lock:
            p = self.cells.setdefault(cell_id, CellProgress(cell_id))
            p.plan, p.plan_jobs = list(order), max(1, jobs)
            p.compile_started, p.unit_ends = time.monotonic(), {}

    def units(self, cell_id: str, done: int, total: int, name: str | None = None) -> None:
        with self._lock:
            p = self.cells.setdefault(cell_id, CellProgress(cell_id))
            p.done, p.total = done, total
            if name and p.compile_started is not None:
                p.unit_ends[os.path.splitext(name)[0]] = time.monotonic() - p.compile_started
            if self.quiet and total:
                pct = 100 * done // total
                if pct // 10 != p.last_printed_pct // 10 or done == total:
                    p.last_printed_pct = pct
                    self.emit(f"[{p.elapsed:6.0f}s] {cell_id}: compiled {done}/{total} units, ETA {p.eta()}")
            self.refresh()


class PlainProgressView(ProgressBoard):
    """The CI lines as plain text on `stream` (default: stderr at the time of writing)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(quiet=True)
        self.stream = stream

    def __enter__(self) -> PlainProgressView:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def emit(self, line: str, level: LogLevel = "info") -> None:
        out = self.stream or sys.stderr
        out.write(line + "\n")
        out.flush()
