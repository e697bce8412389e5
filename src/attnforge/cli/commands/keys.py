"""`attnforge keys`: make a site signing key, and show which key signs and which keys are trusted here."""

from __future__ import annotations

from pathlib import Path

import click

from attnforge.core.errors import AttnforgeError
from attnforge.matrix.project import Project
from attnforge.wheels.signing_keys import (
    KEY_ENV,
    describe,
    generate_key,
    local_key_path,
    project_signing,
    public_path_for,
    signing_key,
    trusted_keys,
)


@click.group("keys")
def command() -> None:
    """The ed25519 keys build and parity records are signed with (`attnforge docs records`)."""


@command.command("generate")
@click.argument("path", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace an existing key (records it signed stop verifying).")
@click.pass_obj
def generate(project: Project, path: Path | None, force: bool) -> None:
    """Write a new private key to PATH (PEM, mode 0600) and its public half to PATH with `.pub`; without
    PATH, this machine's local key (used when no key is configured).

    Give the private key to the machines that build and run parity (`signing.key` in matrix.yaml or
    $ATTNFORGE_SIGNING_KEY), the public key to those that publish and install (`signing.trusted_keys`).
    """
    target = path if path is not None else local_key_path()
    key = generate_key(target, overwrite=force)
    click.echo(f"key {key.keyid}", err=True)
    click.echo(f"private: {target} (keep it secret)", err=True)
    click.echo(f"public:  {public_path_for(target)}", err=True)
    try:
        in_use = signing_key(project_signing(project), create=False)
    except AttnforgeError:  # a broken matrix.yaml or configured key: this new key is not the one in use
        in_use = None
    if in_use is None or in_use.keyid != key.keyid:
        click.echo(
            f"not in use yet: records are signed with it once matrix.yaml says `signing: {{key: {target}}}` "
            f"or ${KEY_ENV}={target} is set (`attnforge keys show` says which key signs)",
            err=True,
        )
    click.echo(key.keyid)


@command.command("show")
@click.pass_obj
def show(project: Project) -> None:
    """Which key signs records here, and which keys publish trusts (nothing is created)."""
    config = project_signing(project)
    key = signing_key(config, create=False)
    if key is None:
        click.echo(
            f"signing key: none configured (${KEY_ENV} or matrix.yaml signing.key name a key file; "
            f"`attnforge keys generate` makes this machine's local key at {local_key_path()}, as the first "
            "build or parity run would)"
        )
    else:
        click.echo(f"signing key: {key.keyid} ({key.path}, {key.origin})")
    click.echo(f"trusted keys: {describe(trusted_keys(config))}")
