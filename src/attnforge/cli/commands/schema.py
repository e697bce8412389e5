"""`attnforge schema`: the matrix.yaml JSON Schema, for editors (yaml-language-server)."""

from __future__ import annotations

import json

import click

from attnforge.matrix.schema import Matrix


@click.command("schema")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write to a file instead of stdout.")
def command(output: str | None) -> None:
    """Print the JSON Schema of matrix.yaml (point your editor at docs/matrix.schema.json)."""
    text = json.dumps(Matrix.model_json_schema(), indent=2) + "\n"
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        click.echo(text, nl=False)
