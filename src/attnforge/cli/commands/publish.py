"""`attnforge publish --to NAME`: finalized wheels to a destination from matrix.yaml."""

from __future__ import annotations

import os
from pathlib import Path

import click

from attnforge.cli.options import trusted_key_option
from attnforge.matrix.project import Project
from attnforge.publish.server_deadline import DEFAULT_TIMEOUT_S, Deadline
from attnforge.wheels.signing_keys import project_signing, trusted_keys


def _log(message: str) -> None:
    click.echo(message, err=True)


def _warn(message: str) -> None:
    """Loud: yellow and bold on a terminal (plain text in logs)."""
    click.secho(message, err=True, fg="yellow", bold=True)


@click.command("publish")
@click.option(
    "--to",
    "target",
    required=True,
    help="A destination of matrix.yaml (`destinations:`), or a folder (static) or http(s) URL (pypiserver).",
)
@click.option(
    "--skip-parity-gate", is_flag=True, help="Publish without a passed GPU parity run (logged loudly)."
)
@click.option(
    "--allow-unsigned",
    is_flag=True,
    help="Publish wheels that have no signed build provenance (logged loudly); a bad record is still refused.",
)
@trusted_key_option(
    "A public key (PEM) records may be signed with, instead of the configured ones. Repeatable."
)
@click.option("--dry-run", is_flag=True, help="Run every check and say what would be published.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1.0),
    default=lambda: os.environ.get("ATTNFORGE_PUBLISH_TIMEOUT") or DEFAULT_TIMEOUT_S,
    show_default=f"$ATTNFORGE_PUBLISH_TIMEOUT or {DEFAULT_TIMEOUT_S:g}",
    help="Seconds an index server may take in all (listing, every upload, the check after).",
)
@click.argument("sources", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.pass_obj
def command(
    project: Project,
    target: str,
    skip_parity_gate: bool,
    allow_unsigned: bool,
    trusted_key: tuple[Path, ...],
    dry_run: bool,
    timeout: float,
    sources: tuple[Path, ...],
) -> None:
    """Publish finalized wheels (default: the build output folder) to a destination, all or nothing.

    Each wheel must agree with its manifest and carry a signed build provenance from a trusted key
    (`attnforge docs records`). Re-publishing a file with other bytes is refused (exit 7); identical bytes are a
    no-op. A destination with `require_parity: true` takes only wheels with a signed parity record that
    says passed. A static index gets a coverage page at its root (index.html): every planned cell of
    matrix.yaml and what the index holds for it.
    """
    from attnforge.publish.coverage_plan import snapshot  # start-up cost
    from attnforge.publish.release import (  # start-up cost
        check_static_root,
        collect_bundles,
        default_sources,
        open_static,
        print_report,
        publish,
        resolve_destination,
    )

    dest, base = resolve_destination(project, target)
    exclude = []
    if dest.kind == "static" and dest.path:
        index = open_static(dest, base)
        check_static_root(index, target, _log)
        exclude.append(index.root)
    bundles = collect_bundles(list(sources) or default_sources(project), exclude=exclude)
    trusted = trusted_keys(project_signing(project), trusted_key)
    report = publish(
        bundles,
        dest,
        target,
        base,
        skip_parity_gate=skip_parity_gate,
        dry_run=dry_run,
        log=_log,
        warn=_warn,
        plan=snapshot(project) if dest.kind == "static" else None,
        trusted=trusted,
        allow_unsigned=allow_unsigned,
        deadline=Deadline(timeout, "publish --timeout or $ATTNFORGE_PUBLISH_TIMEOUT"),
    )
    print_report(report, _log)
