"""The build's progress on screen: a live rich table on a terminal, sparse plain lines in CI logs."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from attnforge.engine.progress import LogLevel, ProgressBoard, interactive

_LEVEL_STYLE: dict[LogLevel, str] = {"warning": "yellow", "error": "red"}


class ConsoleProgressView(ProgressBoard):
    """The engine's `ProgressView` on the terminal; quiet (plain lines) when not interactive."""

    def __init__(self, quiet: bool | None = None) -> None:
        super().__init__(not interactive() if quiet is None else quiet)
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self._live: Live | None = None

    def __enter__(self) -> ConsoleProgressView:
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

    def refresh(self) -> None:
        if self._live:
            self._live.update(self._table())

    def emit(self, line: str, level: LogLevel = "info") -> None:
        """The engine's text is plain: escaped, then coloured by level (colour only on a terminal)."""
        style = _LEVEL_STYLE.get(level)
        self.console.print(f"[{style}]{escape(line)}[/]" if style else escape(line))
