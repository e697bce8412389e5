"""`attnforge build`: compile the planned cells into wheels (Docker by default)."""

from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..build.backend_choice import choose_backend
from ..build.engine import CellResult, Engine
from ..build.progress import ProgressView
from ..cache.lock import build_lock
from ..cell import Cell
from ..errors import BuildError, ConfigurationError
from ..plan import select_cells
from ..project import Project

DEFAULT_TARGET = "default"


def cells_to_build(project: Project, target: str | None, ids: list[str]) -> list[Cell]:
    """The cells of `target`; without one, `default`'s, or each --cell from the first target that has it."""
    if target is not None or not ids:
        return select_cells(project.plan(target or DEFAULT_TARGET), ids)
    names = [DEFAULT_TARGET, *(t for t in project.matrix.targets if t != DEFAULT_TARGET)]
    plans = [project.plan(t) for t in names if t in project.matrix.targets]
    chosen: list[Cell] = []
    for cid in ids:
        plan = next((p for p in plans if any(v.cell.id == cid for v in p.verdicts)), None)
        if plan is None:
            raise ConfigurationError(
                f"no cell '{cid}' in any target ({', '.join(p.target for p in plans)}); see `attnforge plan -t T`"
            )
        chosen += select_cells(plan, [cid])
    return chosen


def summary_table(results: list[CellResult]) -> Table:
    table = Table(title="build summary")
    for col in ("cell", "status", "seconds", "wheel / reason"):
        table.add_column(col, overflow="fold")
    colours = {"built": "green", "skipped": "cyan", "failed": "red", "cancelled": "yellow"}
    for r in results:
        what = escape(r.wheel.name if r.wheel else r.message.splitlines()[0] if r.message else "")
        table.add_row(r.cell.id, f"[{colours.get(r.status, 'white')}]{r.status}[/]", f"{r.seconds:.0f}", what)
    return table


@click.command("build")
@click.option(
    "--target",
    "-t",
    default=None,
    help="Matrix target to build [default: default; with --cell, the first target that has each cell].",
)
@click.option("--cell", "cells", multiple=True, metavar="ID", help="Build only these cells (repeatable).")
@click.option(
    "--backend",
    type=click.Choice(["auto", "docker", "local", "cibuildwheel"]),
    default=None,
    help="Override build.backend (auto: docker when an engine answers, else local; cibuildwheel: docs/build.md).",
)
@click.option("--force", is_flag=True, help="Rebuild cells whose wheel is up to date.")
@click.option(
    "--max-jobs", type=click.IntRange(1), envvar="MAX_JOBS", help="Parallel compile jobs (env MAX_JOBS)."
)
@click.option(
    "--nvcc-threads", type=click.IntRange(1), envvar="NVCC_THREADS", help="nvcc --threads (env NVCC_THREADS)."
)
@click.option(
    "--memory-limit", type=click.FloatRange(0.5), metavar="GB", help="Cap the build's memory (GiB)."
)
@click.option("--parallel-cells", type=click.IntRange(1), default=None, help="Kernel-sets built at once.")
@click.option("--dry-run", is_flag=True, help="Show what would be built and with how many jobs, then stop.")
@click.option(
    "--quiet", is_flag=True, help="Plain progress lines instead of the live view (automatic in CI)."
)
@click.pass_obj
def command(
    project: Project,
    target: str | None,
    cells: tuple[str, ...],
    backend: str | None,
    force: bool,
    max_jobs: int | None,
    nvcc_threads: int | None,
    memory_limit: float | None,
    parallel_cells: int | None,
    dry_run: bool,
    quiet: bool,
) -> None:
    """Build the wheels of a target (or of the cells named with --cell) into build.output_dir.

    \b
    - Unchanged cells (same input hash, wheel bytes intact) are skipped; --force rebuilds.
    - Cells sharing a kernel-set key compile the GPU kernels once; other Pythons only bind.
    - MAX_JOBS/NVCC_THREADS come from cores, memory and measured job sizes unless given.
    - A compiler killed for memory is resumed with fewer jobs, keeping finished units.
    - Logs: <output_dir>/logs/<cell id>.log; each wheel gets <wheel>.manifest.json.
    """
    chosen = cells_to_build(project, target, list(cells))
    console = Console(stderr=True)
    with ProgressView(quiet=True if quiet else None) as view:
        engine_backend = choose_backend(project, backend or project.matrix.build.backend, view)
        engine = Engine(
            project,
            engine_backend,
            view,
            force=force,
            max_jobs=max_jobs,
            nvcc_threads=nvcc_threads,
            memory_limit_gb=memory_limit,
        )
        if dry_run:
            for cell in chosen:
                via = engine.backend_for(cell).name
                view.log(f"{cell.id} -> {cell.wheel_name} ({via}): {engine.parallelism(cell, 1).reason}")
            return
        res = project.matrix.build.resources
        par = parallel_cells or (1 if res.parallel_cells == "auto" else res.parallel_cells)
        with build_lock(engine.cache, on_wait=view.log):  # shared: `cache prune` refuses meanwhile
            results = engine.build(chosen, parallel_cells=par)
    console.print(summary_table(results))
    failed = [r for r in results if r.status == "failed"]
    for r in failed:
        console.print(f"[red]{r.cell.id}[/]: {escape(r.message)}", highlight=False)
    if failed:
        raise BuildError(f"{len(failed)} of {len(results)} cell(s) failed; logs in {engine.logs}")
