"""`attnforge docs [TOPIC]`: the guides that ship with attnforge, listed, printed, or located."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.markdown import Markdown

from attnforge.core.guides import guide, guides, guides_dir


@click.command("docs")
@click.argument("topic", required=False)
@click.option("--path", "show_path", is_flag=True, help="Print where the guide (or the guides' folder) is.")
def command(topic: str | None, show_path: bool) -> None:
    """The guides shipped with attnforge: without TOPIC, list the topics; with one, print its guide
    (rendered on a terminal, the Markdown text itself to a pipe or file)."""
    if topic is None:
        if show_path:
            click.echo(guides_dir())
            return
        every = guides()
        width = max(len(g.topic) for g in every)
        for g in every:
            click.echo(f"{g.topic.ljust(width)}  {g.title}")
        click.echo("\n`attnforge docs TOPIC` prints one; --path says where the files are.", err=True)
        return
    found = guide(topic)
    if show_path:
        click.echo(found.path)
        return
    text = found.path.read_text(encoding="utf-8")
    if sys.stdout.isatty():
        Console().print(Markdown(text))
    else:
        click.echo(text, nl=False)
