"""`attnforge schema`: the matrix.yaml JSON Schema, for editors (yaml-language-server)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from attnforge.builder.files import atomic_write_text
from attnforge.core.errors import ConfigurationError
from attnforge.matrix.schema import Matrix


@click.command("schema")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to a file instead of stdout (its folder is created).",
)
def command(output: Path | None) -> None:
    """Print the JSON Schema of matrix.yaml (write it beside your matrix, e.g. -o matrix.schema.json,
    and name it in matrix.yaml's `# yaml-language-server: $schema=` line)."""
    text = json.dumps(Matrix.model_json_schema(), indent=2) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        atomic_write_text(output, text)
    except OSError as exc:
        raise ConfigurationError(f"--output {output}: cannot write it: {exc.strerror or exc}") from None
    click.echo(f"wrote {output}", err=True)
