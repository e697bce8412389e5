"""`attnforge plan`: every cell of a target with its variant, wheel name, kernel-set key and validity."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnforge.cli.commands.fa4 import render_fa4_cells
from attnforge.engine.cost import PlanCost, plan_cost
from attnforge.engine.resources import detect_machine
from attnforge.engine.unittimes import UnitTimeTable
from attnforge.matrix.plan import Plan, span
from attnforge.matrix.project import Project

# Above this many rows the cells are printed as plain aligned lines: rich lays a 10,000-row table out in ~15 s.
LARGE_PLAN_ROWS = 300


def _rows(plan: Plan, show_invalid: bool) -> list[tuple[tuple[str, str, str, str, str], bool]]:
    """((cell, variant, wheel, kernel-set, valid), is it valid) for each cell shown."""
    rows: list[tuple[tuple[str, str, str, str, str], bool]] = []
    for v in plan.verdicts:
        if not v.valid and not show_invalid:
            continue
        valid = "yes" if v.valid else "no"
        shown = f"{valid} (wheel of {v.served_by})" if v.served_by else valid
        wheel, key = (v.cell.wheel_name, v.cell.kernel_set_key) if v.valid else ("-", "-")
        rows.append(((v.cell.id, v.cell.variant, wheel, key, shown), v.valid))
    return rows


def render_table(plan: Plan, console: Console, show_invalid: bool = True) -> None:
    """The human view: one row per cell, then the summary and the invalid cells' reasons (plain lines, not
    a rich table, for a plan of more than LARGE_PLAN_ROWS cells)."""
    columns = ("cell", "variant", "wheel", "kernel-set", "valid")
    rows = _rows(plan, show_invalid)
    large = len(rows) > LARGE_PLAN_ROWS
    if large:
        widths = [max([len(columns[i]), *(len(r[i]) for r, _ in rows)]) for i in range(len(columns))]
        lines = [
            f"target '{plan.target}'",
            "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)),
        ]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r, _ in rows]
        click.echo("\n".join(lines))
    else:
        table = Table(title=f"target '{plan.target}'", show_lines=False)
        for col in columns:
            table.add_column(col, overflow="fold")
        for cells, ok in rows:
            colour = "green" if ok else "red"
            table.add_row(*map(escape, cells[:4]), f"[{colour}]{escape(cells[4])}[/]")
        console.print(table)
    s = plan.summary()
    per_kernel = ", ".join(f"{n} {k}" for k, n in s["wheels_by_kernel"].items()) or "none"
    served = (
        f" ({s['served_by_another_wheel']} cells share a stable-ABI wheel)"
        if s["served_by_another_wheel"]
        else ""
    )
    out = [
        f"{s['cells']} cells: {s['valid']} valid, {s['invalid']} invalid; {s['wheels']} wheels: {per_kernel}"
        f"{served}; {s['kernel_sets']} distinct kernel-sets; variants: {', '.join(s['variants']) or '-'}"
    ]
    sets = plan.shared_kernels()
    if sets:
        out.append("kernel sets (the cells of one link the same compiled kernel objects):")
    for k in sets:
        c = k.cells[0]
        lane = f"{c.toolkit} abi{int(c.cxx11_abi)} {','.join(a.replace('sm_', '') for a in c.arches)} {c.profile}"
        out.append(f"  {k.key} {lane}: {len(k.cells)} cell(s); {k.why}")
    if show_invalid:
        out += [f"invalid {v.cell.id}: {'; '.join(v.reasons())}" for v in plan.invalid]
    if large:
        click.echo("\n".join(out))
        return
    for line in out:
        if line.startswith("invalid "):
            console.print(f"[red]invalid[/]{escape(line[len('invalid') :])}", highlight=False)
        else:
            console.print(escape(line), highlight=False)


def render_cost(cost: PlanCost, console: Console) -> None:
    """Kernel sets with their units and hours, then what sharing kernels saves."""
    table = Table(title=f"target '{cost.target}': compile cost (shared kernel objects)")
    for col in (
        "kernel-set",
        "toolkit",
        "arches",
        "profile",
        "abi",
        "torch",
        "python",
        "cells",
        "wheels",
        "units",
        "hours",
    ):
        table.add_column(col, overflow="fold")
    for s in sorted(cost.shared.sets, key=lambda s: s.compile_s, reverse=True):
        c, every = s.cells[0], s.all_cells
        table.add_row(
            s.key,
            str(c.toolkit),
            ",".join(a.replace("sm_", "") for a in c.arches),
            c.profile,
            "1" if c.cxx11_abi else "0",
            span({x.torch_family for x in every}),
            span({x.python for x in every}),
            str(len(every)),
            str(s.wheels),
            f"{s.kernel_units}+{s.wheels}",
            f"{s.compile_s / 3600:.1f}",
        )
    console.print(table)
    rows = (
        ("shared across torch and Python", cost.shared),
        ("shared across Python only", cost.per_torch),
        ("not shared", cost.none),
    )
    for label, sc in rows:
        console.print(
            f"{label}: {len(sc.sets)} kernel sets, {sc.wheels} wheels, {sc.units} units to compile, "
            f"{sc.compile_s / 3600:.1f} compile hours (about {sc.wall_s(cost.cores) / 3600:.1f} h on {cost.cores} cores)"
        )
    saved = cost.per_torch.compile_s - cost.shared.compile_s
    console.print(
        f"sharing kernels across torch releases saves {saved / 3600:.1f} compile hours "
        f"({100 * saved / max(cost.per_torch.compile_s, 1):.0f}%)"
    )
    alone = cost.per_torch_bindings
    if alone is not None and cost.stable_abi_saves:
        console.print(
            f"stable-ABI wheels: {cost.shared.wheels} wheels and bindings serve {cost.shared.cells} cells; with a "
            f"per-torch wheel for each: {alone.wheels} wheels and bindings, {alone.compile_s / 3600:.1f} compile hours"
        )
    if cost.not_estimated:
        console.print(
            f"not estimated (no unit model): {len(cost.not_estimated)} cell(s), e.g. {cost.not_estimated[0].id}"
        )
    console.print(
        f"times: seconds of one compile job from the unit-time table, x{cost.factor:.2f} for this machine"
    )


@click.command("plan")
@click.option("--target", "-t", default="default", show_default=True, help="Target (slice) of the matrix.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--valid-only", is_flag=True, help="Leave invalid cells out of the table.")
@click.option("--cost", is_flag=True, help="Kernel sets, units to compile and estimated compile hours.")
@click.option(
    "--cores", type=click.IntRange(1), default=None, help="With --cost: cores to plan for [this machine's]."
)
@click.pass_obj
def command(project: Project, target: str, fmt: str, valid_only: bool, cost: bool, cores: int | None) -> None:
    """Show the cells a target expands to, each valid or invalid with the rule that rejects it.

    Cells that share a kernel-set key link the same compiled kernel objects: the kernels compile once, each
    (torch, Python) compiles only its binding; the table is followed by each kernel set with the reason its
    cells share them. --cost estimates what compiling the target takes.
    """
    plan = project.plan(target)
    if cost:
        table = UnitTimeTable(project.path(project.matrix.build.cache_dir) / "unit_times.json")
        result = plan_cost(plan, table, cores or detect_machine().cores)
        if fmt == "json":
            click.echo(json.dumps(result.to_json(), indent=2))
        else:
            render_cost(result, Console())
        return
    if fmt == "json":
        click.echo(json.dumps(plan.to_json(), indent=2))
        return
    if plan.verdicts or not plan.fa4:
        render_table(plan, Console(), show_invalid=not valid_only)
    if plan.fa4:
        render_fa4_cells(plan.fa4, Console(), f"target '{plan.target}': FA4 cells", not valid_only)
