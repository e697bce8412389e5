"""`attnforge lock`: pin every kernel sdist's sha256 (from the index) in attnforge.lock."""

from __future__ import annotations

import click

from ..matrix.lock import write_lock
from ..project import Project


@click.command("lock")
@click.pass_obj
def command(project: Project) -> None:
    """Resolve each pypi-sdist kernel on PyPI and write its URL and sha256 to attnforge.lock.

    Builds verify the downloaded sdist against this pin, so a changed upstream file is caught
    before anything compiles. A pin in matrix.yaml (kernels.<name>.source.sha256) wins.
    """
    lock = write_lock(project.matrix, project.lock_path)
    for kernel, versions in lock.items():
        for version, entry in versions.items():
            click.echo(f"{kernel} {version}: sha256 {entry['sha256']}")
    click.echo(f"wrote {project.lock_path}")
