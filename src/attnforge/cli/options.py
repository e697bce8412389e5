"""Click options that several commands share, declared once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def trusted_key_option(help_text: str) -> Callable[[F], F]:
    """`--trusted-key PEM` (repeatable): a public key the signed records may be signed with."""
    return click.option(
        "--trusted-key",
        "trusted_key",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=help_text,
    )


static_destination_option = click.option(
    "--to",
    "target",
    default="local",
    show_default=True,
    help="The static destination of matrix.yaml (or a folder) that holds the wheel.",
)
