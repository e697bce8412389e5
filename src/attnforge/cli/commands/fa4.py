"""`attnforge fa4`: FlashAttention-4 (CuTe DSL) kernels compiled ahead of time and shipped as a wheel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnforge.core.errors import BuildError, ConfigurationError
from attnforge.matrix.fa4_plan import FA4Verdict, grid
from attnforge.matrix.fa4_section import FA4Section
from attnforge.matrix.project import Project


def render_fa4_cells(
    verdicts: list[FA4Verdict], console: Console, title: str, show_invalid: bool = True
) -> None:
    """FA4 cells as `attnforge plan` shows cells: one row each (cell, variant, wheel, valid), then a count
    and each refused cell's rules."""
    table = Table(title=title)
    for col in ("cell", "variant", "wheel", "valid"):
        table.add_column(col, overflow="fold")
    for v in verdicts:
        if v.valid or show_invalid:
            served = f" (wheel of {escape(v.served_by)})" if v.served_by else ""
            ok = f"[green]yes{served}[/]" if v.valid else "[red]no[/]"
            table.add_row(escape(v.id), escape(v.variant), escape(v.wheel), ok)
    console.print(table)
    valid = sum(v.valid for v in verdicts)
    wheels = len({v.wheel for v in verdicts if v.valid})
    console.print(
        f"{len(verdicts)} FA4 cells: {valid} valid, {len(verdicts) - valid} invalid; {wheels} kernel wheels "
        "(one serves every torch >= its cell's), built on a GPU by `attnforge fa4 build` (`attnforge docs fa4`)",
        highlight=False,
    )
    if show_invalid:
        for v in verdicts:
            if not v.valid:
                console.print(
                    f"[red]invalid[/] {escape(v.id)}: {escape('; '.join(v.problems))}", highlight=False
                )


def _section(project: Project) -> FA4Section:
    section = project.matrix.fa4
    if section is None:
        raise ConfigurationError(
            f"{project.matrix_path}: no fa4 section (its stack and declarations: `attnforge docs fa4`)"
        )
    return section


@click.group("fa4")
def command() -> None:
    """FlashAttention-4: its stack and cells, its run-time compiles done ahead of time (`attnforge docs fa4`).

    The stack and the declared calls are matrix.yaml's `fa4` section; the wheel `attnforge-fa4-kernels`
    holds FA4 persistent-cache entries; installed, FA4 finds them.
    """


@command.command("plan")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_obj
def plan(project: Project, fmt: str) -> None:
    """Every FA4 cell (CUDA major x torch floor x Python x GPU arch), valid or the rules that refuse it, with
    the stack per CUDA major and the declarations of matrix.yaml's `fa4` section."""
    section = _section(project)
    found = grid(section)
    stack = {cu: section.requirements(cu) for cu in section.cuda_majors}
    if fmt == "json":
        rows = [
            {
                "cell": v.id,
                "valid": v.valid,
                "refused": v.problems,
                "variant": v.variant,
                "wheel": v.wheel,
                "served_by": v.served_by,
            }
            for v in found
        ]
        decls = [d.to_json() for d in section.declarations]
        click.echo(json.dumps({"cells": rows, "stack": stack, "declarations": decls}, indent=1))
        return
    console = Console()
    for cu, reqs in stack.items():
        console.print(f"stack cuda{cu}: {' '.join(reqs)}", highlight=False)
    console.print(
        f"declarations: {', '.join(d.name for d in section.declarations) or 'none'}", highlight=False
    )
    render_fa4_cells(found, console, "FA4 cells")


@command.command("build")
@click.option(
    "--decls",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A JSON list of FA4 declarations instead of matrix.yaml's fa4.declarations (`attnforge docs fa4`).",
)
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("wheels/fa4"), show_default=True
)
@click.option(
    "--python", "python", default=sys.executable, show_default=True, help="Interpreter with FA4 and torch."
)
@click.pass_obj
def build(project: Project, decls: Path | None, out: Path, python: str) -> None:
    """Compile each declaration on this GPU (fresh process, empty cache each), collect FA4's cache entries
    and package them as the `attnforge-fa4-kernels` wheel."""
    from attnforge.fa4 import declare  # start-up cost

    try:
        if decls is None:
            items = [d.to_json() for d in _section(project).declarations]
            declare.parse_all(items, f"{project.matrix_path}: fa4.declarations")
            out.mkdir(parents=True, exist_ok=True)
            decls = out / "declarations.json"
            decls.write_text(json.dumps(items, indent=1) + "\n", encoding="utf-8")
        else:
            declare.load(decls)
    except declare.DeclarationError as exc:
        raise ConfigurationError(str(exc)) from None
    p = subprocess.run(
        [python, "-m", "attnforge.fa4.worker", "build", "--decls", str(decls), "--out", str(out)]
    )
    if p.returncode != 0:
        raise BuildError(f"fa4 build failed (exit {p.returncode}); see the lines above and {out}/artifacts")


@command.command("package")
@click.argument("artifacts", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("wheels/fa4/dist"),
    show_default=True,
)
def package(artifacts: Path, out: Path) -> None:
    """Package built FA4 cache entries (ARTIFACTS: manifest.json and cache/) as a wheel."""
    from attnforge.fa4.package import PackageError, build_wheel  # start-up cost

    try:
        click.echo(str(build_wheel(artifacts, out)))
    except PackageError as exc:
        raise BuildError(str(exc)) from None
