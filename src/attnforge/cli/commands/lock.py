"""`attnforge lock`: pin every kernel's source in attnforge.lock (sdist/url/path sha256, git commit)."""

from __future__ import annotations

import click

from attnforge.matrix.project import Project
from attnforge.matrix.source_lock import write_lock


@click.command("lock")
@click.pass_obj
def command(project: Project) -> None:
    """Pin each kernel's source in attnforge.lock: a pypi-sdist's URL and sha256 (from the index), a url or
    path archive's sha256, a git ref's commit.

    Builds verify the source against this pin, so a changed upstream file is caught before anything
    compiles. A pin in matrix.yaml (kernels.<name>.source.sha256) wins and must agree.
    """
    lock = write_lock(project.matrix, project.lock_path)
    for kernel, versions in lock.items():
        for version, entry in versions.items():
            pin = f"sha256 {entry['sha256']}" if "sha256" in entry else f"commit {entry['commit']}"
            click.echo(f"{kernel} {version}: {pin}")
    click.echo(f"wrote {project.lock_path}")
