"""`attnforge runner check` on screen: the report of attnforge.runner.check_report as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnforge.runner.check_report import RunnerReport

_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "blue"}


def render(report: RunnerReport, console: Console) -> None:
    """The human view: GPUs, then one row per check, then the labels to register the runner with."""
    console.print(f"[bold]{escape(report.device)}[/]  driver {report.found.driver or '-'}", highlight=False)
    table = Table(title="runner check")
    for col in ("check", "status", "detail"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        status = c.status + (" (blocking)" if c.blocking else "")
        table.add_row(escape(c.name), f"[{_STYLE.get(c.status, 'white')}]{status}[/]", escape(c.detail))
    console.print(table)
    custom = [x for x in report.labels if x not in ("self-hosted", "linux", "x64", "arm64")]
    console.print(f"register with: ./config.sh ... --labels {','.join(custom) or 'gpu'}", highlight=False)
