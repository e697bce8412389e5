"""`attnforge compat refresh`: what the package index has that the compat data in use does not."""

from __future__ import annotations

import json
from pathlib import Path

import click

from attnforge.core.errors import AttnforgeError, ConfigurationError
from attnforge.matrix.compat import compat_tables, load_compat
from attnforge.matrix.compat_refresh.index import Index, LiveIndex, Recorder, SnapshotIndex
from attnforge.matrix.compat_refresh.overlay_file import DEFAULT_OVERLAY, write_rows
from attnforge.matrix.compat_refresh.refresh import refresh
from attnforge.matrix.project import Project
from attnforge.matrix.source_lock import PYPI_SIMPLE


class UpstreamMoved(AttnforgeError):
    """`compat refresh --check`: the index has what the compat data in use does not."""

    exit_code = 1


@click.group("compat")
def command() -> None:
    """The compatibility data: compare it with the package index, keep an overlay current."""


def _pins(project: Project) -> dict[str, str]:
    """Projects the matrix pins outside the compat data (FA4's stack), when a matrix is at hand."""
    if not project.matrix_path.is_file():
        return {}
    try:
        fa4 = project.matrix.fa4
    except AttnforgeError:
        return {}
    pin = fa4.stack.get("common", {}).get("flash-attn-4") if fa4 else None
    return {"flash-attn-4": pin} if pin else {}


@command.command("refresh")
@click.option(
    "--compat",
    "overlay",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"The overlay to compare and write (default: the global --compat, else {DEFAULT_OVERLAY} beside the "
    "matrix file).",
)
@click.option(
    "--snapshot",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="ATTNFORGE_COMPAT_SNAPSHOT",
    help="Read a recorded snapshot of the index instead ($ATTNFORGE_COMPAT_SNAPSHOT).",
)
@click.option(
    "--index-url",
    default=PYPI_SIMPLE,
    show_default=True,
    envvar="ATTNFORGE_COMPAT_INDEX_URL",
    help="The simple API to read: an org's mirror ($ATTNFORGE_COMPAT_INDEX_URL, e.g. in the refresh workflow's env).",
)
@click.option("--check", is_flag=True, help="Exit 1 when upstream moved (rows would be added or changed).")
@click.option("--write", is_flag=True, help="Write the new and changed rows into the overlay.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    hidden=True,
    help="Save what was read as a snapshot.",
)
@click.pass_obj
def refresh_command(
    project: Project,
    overlay: Path | None,
    snapshot: Path | None,
    index_url: str,
    check: bool,
    write: bool,
    fmt: str,
    record: Path | None,
) -> None:
    """Read torch releases (Python tags, default CUDA, C++ standard, Philox layout from their wheels),
    CPython, CUDA toolkit and flash-attn releases off the package index and report what is new against the
    compat data in use; --write puts each new row, with its source and date, into the overlay."""
    if snapshot and record:
        raise ConfigurationError("--record saves a live read: it cannot be combined with --snapshot")
    beside = project.matrix_path.parent / DEFAULT_OVERLAY
    path = overlay or (Path(project.compat_path) if project.compat_path else beside)
    tables = compat_tables(str(path) if path.is_file() else None)
    index: Index
    recorder: Recorder | None = None
    taken: str | None = None
    if snapshot:
        index = SnapshotIndex(snapshot)
        taken = index.taken
    else:
        recorder = Recorder(LiveIndex(index_url)) if record else None
        index = recorder or LiveIndex(index_url)
    report = refresh(tables, index, _pins(project), taken)
    if recorder is not None and record is not None:
        record.write_text(json.dumps(recorder.snapshot(), indent=1, sort_keys=True) + "\n")
    if write and report.writable():
        write_rows(path, [(f.table, f.row) for f in report.writable()])
        load_compat.cache_clear()
        load_compat(str(path))  # what was written must load: a bad row fails here, named
    if fmt == "json":
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        click.echo(report.text())
        if write:
            n = len(report.writable())
            click.echo(f"wrote {n} row(s) to {path}" if n else f"nothing to write to {path}")
    if check and report.moved:
        moved = [f for f in report.findings if f.moved]
        raise UpstreamMoved(
            f"upstream moved: {len(moved)} finding(s) against the compat data in use "
            f"({', '.join(f'[[{f.table}]] {f.key}' for f in moved)})"
        )
