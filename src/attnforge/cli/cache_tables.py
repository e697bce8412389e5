"""The rich tables of `attnforge cache du` (the data and plain cells: attnforge.cache.usage_report)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from attnforge.cache.docker_items import DockerItem
from attnforge.cache.scan import CacheEntry
from attnforge.cache.units import format_age, format_size
from attnforge.cache.usage_report import Membership, age, belongs_to, by_kind, shown


def _flag(text: str) -> str:
    return f"[yellow]{text}[/]"


def entries_table(entries: list[CacheEntry], now: float, matrix: Membership | None, base: Path) -> Table:
    table = Table(title=f"cache entries (paths relative to {base})")
    for col, justify in (("kind", "left"), ("entry", "left"), ("size", "right"), ("last used", "right")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    table.add_column("belongs to", overflow="fold")
    for e in entries:
        table.add_row(
            e.kind, shown(e.path, base), format_size(e.size), age(e, now), belongs_to(e, matrix, _flag)
        )
    return table


def kinds_table(entries: list[CacheEntry], now: float) -> Table:
    table = Table(title="by kind")
    for col in ("kind", "entries", "size", "newest use", "oldest use"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for kind, row in by_kind(entries).items():
        used = [e.last_used for e in entries if e.kind == kind and e.last_used]
        newest = format_age(now - max(used)) if used else "-"
        oldest = format_age(now - min(used)) if used else "-"
        table.add_row(kind, str(row["entries"]), format_size(row["bytes"]), newest, oldest)
    total = sum(e.size for e in entries)
    table.add_row("[bold]total[/]", str(len(entries)), f"[bold]{format_size(total)}[/]", "", "")
    return table


def docker_table(items: list[DockerItem]) -> Table:
    table = Table(title="Docker (attnforge images and build containers)")
    for col in ("kind", "id", "name", "size", "created", "prune --docker"):
        table.add_column(col, overflow="fold")
    for i in items:
        gone = "removes" if i.garbage else "keeps"
        table.add_row(i.kind, i.id, i.name, format_size(i.size) if i.size else "-", i.created, gone)
    return table
