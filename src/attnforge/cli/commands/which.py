"""`attnforge which`: the exact `pip install` (or uv's pyproject entries) for this environment from an attnforge
index."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from attnforge.cli.options import (
    index_url_checked,
    records_url_option,
    trusted_key_option,
    user_python_option,
)
from attnforge.client.index_fetch import CONNECT_TIMEOUT_S, TOTAL_BUDGET_S, IndexReader
from attnforge.core.errors import AttnforgeError, ConfigurationError, NothingToDoError, RecordRefused
from attnforge.core.index_urls import redact_urls
from attnforge.core.kernels import KERNELS
from attnforge.engine.environment import Env
from attnforge.matrix.project import Project
from attnforge.wheels.signing_keys import project_signing, trusted_keys


def _verify(
    project: Project,
    index_url: str,
    kernel: str,
    filename: str,
    keys: tuple[Path, ...],
    reader: IndexReader,
    records_url: str | None = None,
) -> None:
    """Check the chosen wheel's records (stderr), read within `reader`'s budget; RecordRefused (exit 7) when
    one does not hold."""
    from attnforge.client.record_check import offered, verify_offered  # start-up cost

    lines = verify_offered(
        offered(index_url, kernel, lambda name: name == filename, reader),
        trusted_keys(project_signing(project), keys),
        reader,
        records_url,
    )
    for line in lines:
        click.echo(f"{line.status:<4} {line.name}: {redact_urls(line.detail)}", err=True)
    failed = [line for line in lines if line.status == "fail"]
    if failed:
        raise RecordRefused(f"{filename}: " + "; ".join(f"{f.name}: {f.detail}" for f in failed))


DEFAULT_INDEX = "http://127.0.0.1:8000"  # `attnforge serve`'s address


@click.command("which")
@click.option(
    "--index-url",
    default=lambda: os.environ.get("ATTNFORGE_INDEX_URL"),
    show_default=f"$ATTNFORGE_INDEX_URL or {DEFAULT_INDEX}",
    callback=index_url_checked,
    help="The index root (holding all/ and <variant>/), a folder, or a simple/ URL.",
)
@user_python_option
@click.option("--profile", help="Accept a lean profile's wheel (its local-version tag, e.g. infer).")
@click.option(
    "--head-dim",
    type=click.IntRange(min=1),
    help="Find the wheel of any profile with the kernel for this head dim (what a narrower wheel's error asks).",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp16", "bf16", "fp8"]),
    help="Likewise: any profile with this dtype's kernels.",
)
@click.option("--backward", is_flag=True, help="Likewise: any profile with backward kernels.")
@click.option(
    "--torch",
    "torch",
    help="Answer for this torch release instead of the installed one (e.g. 2.13, or 2.13.0+cu128 for "
    "another CUDA build): before changing a project's torch.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["pip", "uv", "json"]),
    default="pip",
    show_default=True,
    help="pip: the install command; uv: pyproject.toml entries for uv (and the `uv add` to run); "
    "json: the decision.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--kernel",
    type=click.Choice(KERNELS),
    default="flash-attn",
    show_default=True,
    help="The project to look up in the index (flash-attn-3: stable-ABI wheels).",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Check the chosen wheel's signed records (provenance, SBOM, parity) first; exit 7 when they fail.",
)
@trusted_key_option("With --verify: a public key (PEM) records may be signed with. Repeatable.")
@records_url_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=1.0),
    default=TOTAL_BUDGET_S,
    show_default=True,
    help=f"Seconds for reading the index in all (each connection or read: at most {CONNECT_TIMEOUT_S:g} s).",
)
@click.pass_obj
def command(
    project: Project,
    index_url: str | None,
    python: str | None,
    profile: str | None,
    head_dim: int | None,
    dtype: str | None,
    backward: bool,
    torch: str | None,
    fmt: str,
    as_json: bool,
    kernel: str,
    verify: bool,
    trusted_key: tuple[Path, ...],
    records_url: str | None,
    timeout: float,
) -> None:
    """Print how to install the wheel that fits the user's environment, or why none fits (exit 3).

    The environment is the one of --python, else of the active venv, conda environment or python3 on PATH
    (the report names it). Compared: Python, platform, torch release, the torch build's CUDA/ROCm, C++ ABI,
    profile (or with --head-dim/--dtype/--backward: any profile with those kernels) and, with a GPU, its
    architecture and the driver. Yanked wheels are never proposed. The command
    (or the uv entries) goes to stdout, the reasoning to stderr. An index that cannot be read says why, with
    the URL: connection refused, timeout, HTTP status, corrupt page (exit 5).
    """
    from attnforge.client.interpreter import choose_interpreter, probe_environment  # start-up cost
    from attnforge.client.kernel_needs import Needs  # start-up cost
    from attnforge.client.which import resolve, with_torch  # start-up cost

    data, inspected = probe_environment(choose_interpreter(python))
    env = Env.from_probe(data)
    if torch:
        env = with_torch(env, torch, project.compat)
    reader = IndexReader(total_s=timeout)
    try:
        needs = Needs(head_dim, dtype, backward)
        res = resolve(env, index_url or DEFAULT_INDEX, profile, kernel, reader, records_url, inspected, needs)
    except AttnforgeError as exc:
        if index_url:
            raise
        hint = (
            f"no index given: name yours with --index-url URL or set ATTNFORGE_INDEX_URL "
            f"(tried the default, {DEFAULT_INDEX}, where `attnforge serve` listens)"
        )
        exc.hint = f"{exc.hint}; {hint}" if exc.hint else hint
        raise
    index_url = res.index_url
    if verify and res.choice is not None:
        _verify(project, index_url, kernel, res.choice.filename, trusted_key, reader, records_url)
    fmt = "json" if as_json else fmt
    if fmt == "json":
        click.echo(redact_urls(json.dumps(res.to_json(), indent=2)))
    else:
        for line in res.explanation:
            click.echo(redact_urls(line), err=True)
        if fmt == "uv" and res.choice is not None:
            if res.uv is None:
                raise ConfigurationError(
                    f"--format uv: {index_url} is not an attnforge index root (no all/simple/ tree)",
                    hint="give the root that holds all/ and the variant folders",
                )
            click.echo(redact_urls(res.uv), nl=False)
        elif res.command:
            click.echo(redact_urls(res.command))
    if res.choice is None:
        where = inspected.path
        raise NothingToDoError(
            f"no wheel in the index fits the environment of {where}"
            + (f"; next: {res.next_step}" if res.next_step else "")
            + (f"; build one with: attnforge build --cell {res.build_cell}" if res.build_cell else "")
        )
