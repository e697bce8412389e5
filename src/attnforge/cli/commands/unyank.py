"""`attnforge unyank WHEEL`: offer a yanked wheel again (PEP 592), atomically."""

from __future__ import annotations

import click

from attnforge.cli.commands.yank import set_yanked
from attnforge.matrix.project import Project


@click.command("unyank")
@click.argument("wheel")
@click.option(
    "--to",
    "target",
    default="local",
    show_default=True,
    help="The static destination of matrix.yaml (or a folder) that holds the wheel.",
)
@click.pass_obj
def command(project: Project, wheel: str, target: str) -> None:
    """Clear the yank of WHEEL in a static index: pip, `which` and the index page offer it again."""
    set_yanked(project, target, wheel, None)
