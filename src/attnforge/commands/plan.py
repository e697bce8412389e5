"""`attnforge plan`: every cell of a target with its variant, wheel name, kernel-set key and validity."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape
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
        valid = "[green]yes[/]" if v.valid else "[red]no[/]"
        table.add_row(
            v.cell.id,
            v.cell.variant,
            v.cell.wheel_name if v.valid else "-",
            v.cell.kernel_set_key if v.valid else "-",
            f"{valid} (wheel of {v.served_by})" if v.served_by else valid,
        )
    console.print(table)
    s = plan.summary()
    per_kernel = ", ".join(f"{n} {k}" for k, n in s["wheels_by_kernel"].items()) or "none"
    served = (
        f" ({s['served_by_another_wheel']} cells share a stable-ABI wheel)"
        if s["served_by_another_wheel"]
        else ""
    )
    console.print(
        f"{s['cells']} cells: {s['valid']} valid, {s['invalid']} invalid; {s['wheels']} wheels: {per_kernel}"
        f"{served}; {s['kernel_sets']} distinct kernel-sets; variants: {', '.join(s['variants']) or '-'}"
    )
    if show_invalid:
        for v in plan.invalid:
            console.print(f"[red]invalid[/] {v.cell.id}: {escape('; '.join(v.reasons()))}", highlight=False)


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
