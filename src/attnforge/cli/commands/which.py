"""`attnforge which`: the exact `pip install` for this environment from an attnforge index."""

from __future__ import annotations

import json
import os

import click

from attnforge.client.index_fetch import CONNECT_TIMEOUT_S, TOTAL_BUDGET_S
from attnforge.core.errors import NothingToDoError
from attnforge.core.kernels import KERNELS


@click.command("which")
@click.option(
    "--index-url",
    default=lambda: os.environ.get("ATTNFORGE_INDEX_URL", "http://127.0.0.1:8000"),
    show_default="$ATTNFORGE_INDEX_URL or http://127.0.0.1:8000",
    help="The index root (holding all/ and <variant>/), a folder, or a simple/ URL.",
)
@click.option("--python", "python", help="Inspect this interpreter's environment (default: attnforge's own).")
@click.option("--profile", help="Accept a lean profile's wheel (its local-version tag, e.g. infer).")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
@click.option(
    "--kernel",
    type=click.Choice(KERNELS),
    default="flash-attn",
    show_default=True,
    help="The project to look up in the index (flash-attn-3: stable-ABI wheels).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1.0),
    default=TOTAL_BUDGET_S,
    show_default=True,
    help=f"Seconds for reading the index in all (each connection or read: at most {CONNECT_TIMEOUT_S:g} s).",
)
def command(
    index_url: str, python: str | None, profile: str | None, as_json: bool, kernel: str, timeout: float
) -> None:
    """Print the pip command for the wheel that fits this environment, or why none fits (exit 3).

    Compared: Python, platform, torch release, the torch build's CUDA/ROCm, C++ ABI, profile and, with a
    GPU, its architecture and the driver. The command goes to stdout, the reasoning to stderr. An index that
    cannot be read says why, with the URL: connection refused, timeout, HTTP status, corrupt page (exit 5).
    """
    from attnforge.client.index_fetch import IndexReader
    from attnforge.client.which import resolve
    from attnforge.engine.environment import Env, run_probe

    env = Env.from_probe(run_probe(python))
    res = resolve(env, index_url, profile, kernel, IndexReader(total_s=timeout))
    if as_json:
        click.echo(json.dumps(res.to_json(), indent=2))
    else:
        for line in res.explanation:
            click.echo(line, err=True)
        if res.command:
            click.echo(res.command)
    if res.choice is None:
        raise NothingToDoError(
            "no wheel in the index fits this environment"
            + (f"; build one with: attnforge build --cell {res.build_cell}" if res.build_cell else "")
        )
