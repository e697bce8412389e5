"""`attnforge doctor`: check the installed flash-attn against torch, ABI, Python, GPU and driver."""

from __future__ import annotations

import json
import os

import click

from attnforge.core.errors import EnvironmentProblem
from attnforge.core.kernels import KERNELS

_STYLE = {"ok": "green", "fail": "red", "warn": "yellow", "skip": "blue"}


@click.command("doctor")
@click.option("--python", "python", help="Inspect this interpreter's environment (default: attnforge's own).")
@click.option("--json", "as_json", is_flag=True, help="Print the probe and the checks as JSON.")
@click.option(
    "--kernel",
    type=click.Choice(KERNELS),
    default="flash-attn",
    show_default=True,
    help="The installed kernel package to check (flash-attn-3: imports flash_attn_interface).",
)
@click.option(
    "--index-url",
    default=lambda: os.environ.get("ATTNFORGE_INDEX_URL"),
    show_default="$ATTNFORGE_INDEX_URL",
    help="Also warn when the installed wheel was yanked from this attnforge index since (no index: no check).",
)
def command(python: str | None, as_json: bool, kernel: str, index_url: str | None) -> None:
    """Load the kernel's extension (flash_attn_2_cuda, FA3's flash_attn_interface) and compare the wheel's
    recorded build with this environment.

    Exit 5 when a check fails (torch or ABI mismatch, extension not loading, GPU arch not compiled);
    a yanked wheel is a warning.
    """
    from attnforge.client.doctor import run_doctor

    data, checks = run_doctor(python, kernel, index_url)
    if as_json:
        click.echo(json.dumps({"probe": data, "checks": [c.__dict__ for c in checks]}, indent=2))
    else:
        for c in checks:
            click.echo(f"{click.style(f'{c.status:<4}', fg=_STYLE.get(c.status))} {c.name}: {c.detail}")
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        raise EnvironmentProblem(f"{len(failed)} problem(s): " + "; ".join(c.name for c in failed))
