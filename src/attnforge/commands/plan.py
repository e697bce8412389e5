"""`attnforge plan`: every cell of a target with its variant, wheel name, kernel-set key and validity."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from ..matrix.plan import Plan
from ..project import Project


def render_table(plan: Plan, console: Console, show_invalid: bool = True) -> None:
    """The human view: one row per cell, then the summary and the invalid cells' reasons."""
    table = Table(title=f"target '{plan.target}'", show_lines=False)
    for col in ("cell", "variant", "wheel", "kernel-set", "valid"):
        table.add_column(col, overflow="fold")
    for v in plan.verdicts:
        if not v.valid and not show_invalid:
            continue
        table.add_row(
            v.cell.id,
            v.cell.variant,
            v.cell.wheel_name if v.valid else "-",
            v.cell.kernel_set_key if v.valid else "-",
            "[green]yes[/]" if v.valid else "[red]no[/]",
        )
    console.print(table)
    s = plan.summary()
    console.print(
        f"{s['cells']} cells: {s['valid']} valid, {s['invalid']} invalid; "
        f"{s['kernel_sets']} distinct kernel-sets; variants: {', '.join(s['variants']) or '-'}"
    )
    if show_invalid:
        for v in plan.invalid:
            console.print(f"[red]invalid[/] {v.cell.id}: {'; '.join(v.reasons())}", highlight=False)


@click.command("plan")
@click.option("--target", "-t", default="default", show_default=True, help="Target (slice) of the matrix.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--valid-only", is_flag=True, help="Leave invalid cells out of the table.")
@click.pass_obj
def command(project: Project, target: str, fmt: str, valid_only: bool) -> None:
    """Show the cells a target expands to, each valid or invalid with the rule that rejects it.

    Cells that share a kernel-set key differ only in Python: their GPU code is compiled once.
    """
    plan = project.plan(target)
    if fmt == "json":
        click.echo(json.dumps(plan.to_json(), indent=2))
    else:
        render_table(plan, Console(), show_invalid=not valid_only)
