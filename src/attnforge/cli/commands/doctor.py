"""`attnforge doctor`: check the installed flash-attn against torch, ABI, Python, GPU and driver."""

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
from attnforge.client.doctor_check import Check
from attnforge.client.index_fetch import TOTAL_BUDGET_S, shared_deadline
from attnforge.core.errors import ConfigurationError, EnvironmentProblem, RecordRefused
from attnforge.core.index_urls import redact_urls
from attnforge.core.kernels import KERNELS
from attnforge.matrix.project import Project
from attnforge.wheels.signing_keys import project_signing, trusted_keys

_STYLE = {"ok": "green", "fail": "red", "warn": "yellow", "skip": "blue"}


@click.command("doctor")
@user_python_option
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
    callback=index_url_checked,
    help=(
        "The attnforge index the wheel came from (root, folder or simple/ URL): warn when the installed "
        "wheel was yanked there since, and with --verify check its signed records (no index: no check)."
    ),
)
@click.option(
    "--verify",
    is_flag=True,
    help="Also check the installed wheel against its signed records in the index (--index-url).",
)
@trusted_key_option("With --verify: a public key (PEM) records may be signed with. Repeatable.")
@records_url_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=1.0),
    default=TOTAL_BUDGET_S,
    show_default=True,
    help="Seconds for reading the index in all (the yank check and --verify's records share them).",
)
@click.pass_obj
def command(
    project: Project,
    python: str | None,
    as_json: bool,
    kernel: str,
    index_url: str | None,
    verify: bool,
    trusted_key: tuple[Path, ...],
    records_url: str | None,
    timeout: float,
) -> None:
    """Load the kernel's extension (flash_attn_2_cuda, FA3's flash_attn_interface) and compare the wheel's
    recorded build with the user's environment (--python, else the active venv, conda environment or python3
    on PATH: the first line names it); with --verify, check the installed files against the signed wheel the
    index offers (`attnforge docs records`).

    Exit 5 when a check fails (torch or ABI mismatch, extension not loading, GPU arch not compiled, a record
    or an installed file that does not match); a yanked wheel is a warning.
    """
    from attnforge.client.doctor import run_doctor  # start-up cost
    from attnforge.client.interpreter import choose_interpreter  # start-up cost

    if verify and not index_url:
        raise ConfigurationError(
            "--verify needs the index the wheel came from: --index-url URL or $ATTNFORGE_INDEX_URL"
        )
    with shared_deadline(timeout):  # the yank check and --verify's records: one budget
        interp = choose_interpreter(python)
        data, checks = run_doctor(interp, kernel, index_url)
        if verify and index_url:
            from attnforge.client.record_check import verify_installed  # start-up cost

            try:
                lines = verify_installed(
                    interp.path,
                    index_url,
                    kernel,
                    trusted_keys(project_signing(project), trusted_key),
                    records_url,
                )
                checks += [Check(f"records: {x.name}", x.status, x.detail) for x in lines]
            except RecordRefused as exc:
                checks.append(Check("records", "fail", str(exc)))
    if as_json:
        click.echo(redact_urls(json.dumps({"probe": data, "checks": [c.__dict__ for c in checks]}, indent=2)))
    else:
        for c in checks:
            detail = redact_urls(c.detail)
            click.echo(f"{click.style(f'{c.status:<4}', fg=_STYLE.get(c.status))} {c.name}: {detail}")
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        raise EnvironmentProblem(f"{len(failed)} problem(s): " + "; ".join(c.name for c in failed))
