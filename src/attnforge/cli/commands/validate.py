"""`attnforge validate`: check matrix.yaml and every target without building anything."""

from __future__ import annotations

import click

from attnforge.core.errors import ConfigurationError
from attnforge.matrix.plan import Plan
from attnforge.matrix.project import Project


def _first_reason(plan: Plan) -> str:
    """`cell id: [rule] reason` of the plan's first invalid cell (FA2/FA3 cells first, then FA4 cells)."""
    reasons = [f"{v.cell.id}: {v.reasons()[0]}" for v in plan.verdicts if not v.valid]
    reasons += [f"{v.id}: {v.problems[0]}" for v in plan.fa4 if v.problems]
    return reasons[0] if reasons else "no cell"


@click.command("validate")
@click.option("--strict", is_flag=True, help="Fail when a target contains an invalid cell.")
@click.pass_obj
def command(project: Project, strict: bool) -> None:
    """Parse matrix.yaml, expand every target and report invalid cells.

    Exits 2 when a target has no valid cell (naming it and the first reason), and with --strict when
    any cell is invalid."""
    bad = 0
    empty: list[str] = []  # "target: first reason" of each target without one valid cell
    for name in project.matrix.targets:
        plan = project.plan(name)
        s = plan.summary()
        fa4_bad = sum(not v.valid for v in plan.fa4)
        fa4 = f", FA4 cells: {len(plan.fa4) - fa4_bad} valid, {fa4_bad} invalid" if plan.fa4 else ""
        click.echo(f"{name}: {s['valid']} valid, {s['invalid']} invalid, {s['kernel_sets']} kernel-sets{fa4}")
        bad += s["invalid"] + fa4_bad
        if s["valid"] == 0 and len(plan.fa4) == fa4_bad:
            empty.append(f"target '{name}' has no valid cell ({_first_reason(plan)})")
    if empty:
        more = f" (and {len(empty) - 1} more target(s))" if len(empty) > 1 else ""
        raise ConfigurationError(f"{empty[0]}{more}; `attnforge plan -t T` lists every reason")
    if strict and bad:
        raise ConfigurationError(f"{bad} invalid cell(s); run `attnforge plan --target T` for the reasons")
