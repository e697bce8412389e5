"""`attnforge yank WHEEL --reason TEXT`: withdraw a published wheel from a static index (PEP 592)."""

from __future__ import annotations

import click

from attnforge.cli.options import static_destination_option
from attnforge.matrix.project import Project


def set_yanked(project: Project, target: str, wheel: str, reason: str | None) -> None:
    """Yank (a reason) or unyank (None) `wheel` on the destination `target`; says what changed."""
    from attnforge.publish.release import open_static, resolve_destination  # start-up cost
    from attnforge.publish.yank import refuse_unsupported  # start-up cost
    from attnforge.publish.yank import set_yanked as change  # start-up cost

    dest, base = resolve_destination(project, target)
    refuse_unsupported(dest, target)
    result = change(open_static(dest, base), wheel, reason)
    click.echo(result.describe(), err=True)


@click.command("yank")
@click.argument("wheel")
@click.option("--reason", required=True, help="Why it is withdrawn; pip shows it to whoever pins it.")
@static_destination_option
@click.pass_obj
def command(project: Project, wheel: str, reason: str, target: str) -> None:
    """Mark WHEEL (a file name, or a path whose last part is one) yanked in a static index, atomically.

    The file stays: pip skips it unless a requirement pins its version exactly (then installs it with a
    warning naming the reason), `attnforge which` never proposes it, `attnforge doctor --index-url` warns
    where it is installed, and the index page shows it yanked. `attnforge unyank WHEEL` undoes it.
    A pypiserver cannot yank (exit 7).
    """
    set_yanked(project, target, wheel, reason)
