"""The `attnforge` command line: a click group; each module in attnforge.cli.commands adds one command."""

from __future__ import annotations

import importlib
import os
import pkgutil
from pathlib import Path

import click

from attnforge import __version__
from attnforge.cli import commands
from attnforge.core.errors import AttnforgeError, InterruptedByUser
from attnforge.core.index_urls import redact_urls
from attnforge.matrix.compat_refresh.overlay_file import DEFAULT_OVERLAY
from attnforge.matrix.project import Project


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="attnforge")
@click.option(
    "--matrix",
    "matrix_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=lambda: os.environ.get("ATTNFORGE_MATRIX", "matrix.yaml"),
    show_default="matrix.yaml or $ATTNFORGE_MATRIX",
    help="The matrix file to read.",
)
@click.option(
    "--compat",
    "compat_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    envvar="ATTNFORGE_COMPAT",
    help="A compatibility overlay: its rows replace the packaged rows with the same key, new rows are added "
    "(default: compat.overlay.toml beside the matrix file, when there is one).",
)
@click.pass_context
def cli(ctx: click.Context, matrix_path: Path, compat_path: str | None) -> None:
    """Turn a version matrix into prebuilt, tested attention-kernel wheels and images.

    \b
    Typical flow:
      attnforge plan --target release      show every cell, valid or not, and why
      attnforge build --target default     compile the wheels (Docker by default)
      attnforge publish --to local         write the per-variant pip index
    Exit codes: 2 configuration, 3 nothing to do, 4 build, 5 environment, 6 test, 7 publish.
    """
    if compat_path is None:
        beside = matrix_path.parent / DEFAULT_OVERLAY
        compat_path = str(beside) if beside.is_file() else None
    ctx.obj = Project(matrix_path, compat_path)


def _register() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        command = getattr(module, "command", None)
        if isinstance(command, click.Command):
            cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; AttnforgeError becomes a one-line message and its exit code."""
    try:
        cli.main(args=argv, prog_name="attnforge", standalone_mode=False)
    except AttnforgeError as exc:
        click.secho(f"attnforge: error: {redact_urls(str(exc))}", err=True, fg="red")
        return exc.exit_code
    except click.exceptions.Abort:
        click.secho("attnforge: interrupted", err=True, fg="red")
        return InterruptedByUser.exit_code
    except KeyboardInterrupt:
        click.secho("attnforge: interrupted", err=True, fg="red")
        return InterruptedByUser.exit_code
    except click.ClickException as exc:
        exc.show()
        return 2
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return 0
