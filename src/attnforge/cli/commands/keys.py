"""`attnforge keys`: make a site signing key, and show which key signs and which keys are trusted here."""

from __future__ import annotations

from pathlib import Path

import click

from attnforge.matrix.project import Project


@click.group("keys")
def command() -> None:
    """The ed25519 keys build and parity records are signed with (docs/records.md)."""


@command.command("generate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace an existing key (records it signed stop verifying).")
def generate(path: Path, force: bool) -> None:
    """Write a new private key to PATH (PEM, mode 0600) and its public half to PATH with `.pub`.

    Give the private key to the machines that build and run parity (`signing.key` in matrix.yaml or
    $ATTNFORGE_SIGNING_KEY), the public key to those that publish and install (`signing.trusted_keys`).
    """
    from attnforge.wheels.signing_keys import generate_key, public_path_for

    key = generate_key(path, overwrite=force)
    click.echo(f"key {key.keyid}", err=True)
    click.echo(f"private: {path} (keep it secret)", err=True)
    click.echo(f"public:  {public_path_for(path)}", err=True)
    click.echo(key.keyid)


@command.command("show")
@click.pass_obj
def show(project: Project) -> None:
    """Which key signs records here, and which keys publish trusts (nothing is created)."""
    from attnforge.wheels.signing_keys import describe, project_signing, signing_key, trusted_keys

    config = project_signing(project)
    key = signing_key(config, create=False)
    if key is None:
        click.echo("signing key: none yet (the first build or parity run makes this machine's local key)")
    else:
        click.echo(f"signing key: {key.keyid} ({key.path}, {key.origin})")
    click.echo(f"trusted keys: {describe(trusted_keys(config))}")
