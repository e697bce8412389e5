"""Progress of cell builds: a live rich table on a terminal, sparse plain lines in CI logs."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table


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

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def eta(self) -> str:
        if self.total <= 0 or self.done <= 0 or self.done >= self.total:
            return "-"
        rate = self.elapsed / self.done
        return f"{rate * (self.total - self.done):.0f}s"


def interactive() -> bool:
    """A live view only on a terminal and outside CI."""
    return sys.stderr.isatty() and not os.environ.get("CI")


class ProgressView:
    """Thread-safe; cells report stages and compiled units, the view renders them."""

    def __init__(self, quiet: bool | None = None) -> None:
        self.quiet = not interactive() if quiet is None else quiet
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.cells: dict[str, CellProgress] = {}
        self._lock = threading.Lock()
        self._live: Live | None = None

    def __enter__(self) -> ProgressView:
        if not self.quiet:
            self._live = Live(self._table(), console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live:
            self._live.update(self._table())
            self._live.__exit__(exc_type, exc, tb)

    def _table(self) -> Table:
        table = Table(title="attnforge build", expand=False)
        for col in ("cell", "stage", "units", "elapsed", "ETA"):
            table.add_column(col)
        for p in self.cells.values():
            units = f"{p.done}/{p.total}" if p.total else "-"
            table.add_row(p.cell_id, p.stage, units, f"{p.elapsed:.0f}s", p.eta())
        return table

    def _refresh(self) -> None:
        if self._live:
            self._live.update(self._table())

    def log(self, message: str) -> None:
        """A line that stays (also in quiet mode)."""
        self.console.print(message)

    def stage(self, cell_id: str, stage: str) -> None:
        with self._lock:
            p = self.cells.setdefault(cell_id, CellProgress(cell_id))
            p.stage = stage
            if stage in ("done", "failed", "skipped", "cancelled"):
                p.finished = time.monotonic()
            if self.quiet:
                self.console.print(f"[{p.elapsed:6.0f}s] {cell_id}: {stage}")
            self._refresh()

    def units(self, cell_id: str, done: int, total: int) -> None:
        with self._lock:
            p = self.cells.setdefault(cell_id, CellProgress(cell_id))
            p.done, p.total = done, total
            if self.quiet and total:
                pct = 100 * done // total
                if pct // 10 != p.last_printed_pct // 10 or done == total:
                    p.last_printed_pct = pct
                    self.console.print(
                        f"[{p.elapsed:6.0f}s] {cell_id}: compiled {done}/{total} units, ETA {p.eta()}"
                    )
            self._refresh()
