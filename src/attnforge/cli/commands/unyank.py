"""`attnforge unyank WHEEL`: offer a yanked wheel again (PEP 592), atomically."""

from __future__ import annotations

import click

from attnforge.cli.commands.yank import set_yanked
from attnforge.cli.options import static_destination_option
from attnforge.matrix.project import Project


@click.command("unyank")
@click.argument("wheel")
@static_destination_option
@click.pass_obj
def command(project: Project, wheel: str, target: str) -> None:
    """Clear the yank of WHEEL in a static index: pip, `which` and the index page offer it again."""
    set_yanked(project, target, wheel, None)
