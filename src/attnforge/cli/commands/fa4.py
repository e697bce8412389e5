"""`attnforge fa4`: FlashAttention-4 (CuTe DSL) kernels compiled ahead of time and shipped as a wheel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from attnforge.core.errors import BuildError, ConfigurationError


@click.group("fa4")
def command() -> None:
    """FlashAttention-4: its stack and cells, its run-time compiles done ahead of time (docs/fa4.md).

    The wheel `attnforge-fa4-kernels` holds FA4 persistent-cache entries; installed, FA4 finds them.
    """


@command.command("plan")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def plan(fmt: str) -> None:
    """Every FA4 cell (CUDA major x torch floor x Python x GPU arch), valid or the rules that refuse it."""
    from attnforge.fa4.stack import cells, requirements

    found = cells()
    if fmt == "json":
        rows = [{"cell": c.id, "valid": not why, "refused": why} for c, why in found]
        click.echo(json.dumps({"cells": rows, "stack": {cu: requirements(cu) for cu in (12, 13)}}, indent=1))
        return
    for c, why in found:
        click.echo(f"{c.id:<34} {'; '.join(why) if why else 'valid'}")


@command.command("build")
@click.option(
    "--decls",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="JSON list of FA4 declarations (docs/fa4.md).",
)
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("wheels/fa4"), show_default=True
)
@click.option(
    "--python", "python", default=sys.executable, show_default=True, help="Interpreter with FA4 and torch."
)
def build(decls: Path, out: Path, python: str) -> None:
    """Compile each declaration on this GPU (fresh process, empty cache each), collect FA4's cache entries
    and package them as the `attnforge-fa4-kernels` wheel."""
    from attnforge.fa4 import declare

    try:
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
    from attnforge.fa4.package import PackageError, build_wheel

    try:
        click.echo(str(build_wheel(artifacts, out)))
    except PackageError as exc:
        raise BuildError(str(exc)) from None
