"""`attnforge build`: compile the planned cells into wheels (Docker by default), or build against an
existing interpreter's torch (`--python`)."""

from __future__ import annotations

import os

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnforge.cache.build_lock import build_lock
from attnforge.cli.options import requested_settings
from attnforge.cli.progress_view import ConsoleProgressView
from attnforge.core.errors import BuildError, ConfigurationError
from attnforge.engine.backends.choice import choose_backend
from attnforge.engine.backends.docker import DockerBackend
from attnforge.engine.backends.env import EnvBackend, environment_cells, read_environment, template_cell
from attnforge.engine.jobs import Backend
from attnforge.engine.run import CellResult, Engine
from attnforge.engine.settings import parallel_cells_of
from attnforge.matrix.cell import Cell
from attnforge.matrix.plan import select_cells
from attnforge.matrix.project import Project
from attnforge.matrix.schema import TOOLKIT_RE

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


def environment_build(
    project: Project,
    python: str,
    target: str | None,
    ids: list[str],
    profile: str | None,
    arches: list[str],
    kernel: str | None = None,
) -> tuple[EnvBackend, list[Cell]]:
    """The env backend for `python` and the cells to build against its torch: the kernel, profile and
    arches of --target/--cell, or of --kernel/--profile/--arch (default: the matrix's default kernel and
    profile, this machine's GPUs)."""
    python = os.path.abspath(python)  # not resolved: a venv's python is a link to its base interpreter
    env = read_environment(python)
    if target is not None or ids:
        if profile or arches or kernel:
            raise ConfigurationError(
                "--kernel/--profile/--arch and --target/--cell both name what to compile: give one"
            )
        templates = cells_to_build(project, target, ids)
    else:
        templates = [template_cell(project, env, profile, arches, kernel)]
    return EnvBackend(python, env), environment_cells(project, env, templates)


def parse_base_images(values: tuple[str, ...]) -> dict[str, str]:
    """`--base-image TOOLKIT=IMAGE` values -> {toolkit: image}; a malformed one is an error naming it."""
    out: dict[str, str] = {}
    for raw in values:
        toolkit, sep, image = raw.partition("=")
        if not sep or not TOOLKIT_RE.match(toolkit) or not image:
            raise ConfigurationError(
                f"--base-image {raw!r}: expected TOOLKIT=IMAGE, e.g. cuda12.4=nvidia/cuda:12.4.1-devel-ubuntu22.04"
            )
        out[toolkit] = image
    return out


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
    type=click.Choice(["auto", "docker", "local"]),
    default=None,
    help="Override build.backend (auto: docker when an engine answers, else local). --python selects env.",
)
@click.option(
    "--python",
    "python",
    metavar="PATH",
    help="Build against the torch installed for this interpreter (GPU runner, NGC image): no venv, nothing "
    "installed; torch, CUDA/ROCm, ABI and Python come from it (backend env).",
)
@click.option(
    "--kernel",
    default=None,
    help="With --python: the kernel to build (flash-attn, flash-attn-3) [default: defaults.kernel].",
)
@click.option(
    "--profile", default=None, help="With --python: the profile to compile [default: defaults.profile]."
)
@click.option(
    "--arch",
    "arches",
    multiple=True,
    metavar="ARCH",
    help="With --python: an arch to compile (repeatable) [default: this machine's GPUs].",
)
@click.option(
    "--base-image",
    "base_images",
    multiple=True,
    metavar="TOOLKIT=IMAGE",
    help="Builder base for a toolkit, over build.base_images and local_base (repeatable), e.g. "
    "cuda12.4=nvidia/cuda:12.4.1-devel-ubuntu22.04; a registry base pinned in docker/bases.toml is used by digest.",
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
@click.option(
    "--parallel-cells",
    type=click.IntRange(1),
    default=None,
    help="Kernel sets compiled at once [default: build.resources.parallel_cells; auto: from unit estimates].",
)
@click.option("--dry-run", is_flag=True, help="Show what would be built and with how many jobs, then stop.")
@click.option(
    "--builder-image-only",
    is_flag=True,
    help="Docker backend: build (or reuse) the builder image of each CUDA toolkit of the chosen cells, print "
    "its tag, then stop (no cell is built).",
)
@click.option(
    "--quiet", is_flag=True, help="Plain progress lines instead of the live view (automatic in CI)."
)
@click.pass_obj
def command(
    project: Project,
    target: str | None,
    cells: tuple[str, ...],
    backend: str | None,
    python: str | None,
    kernel: str | None,
    profile: str | None,
    arches: tuple[str, ...],
    base_images: tuple[str, ...],
    force: bool,
    max_jobs: int | None,
    nvcc_threads: int | None,
    memory_limit: float | None,
    parallel_cells: int | None,
    dry_run: bool,
    builder_image_only: bool,
    quiet: bool,
) -> None:
    """Build the wheels of a target (or of the cells named with --cell) into build.output_dir.

    \b
    - Unchanged cells (same input hash, wheel bytes intact) are skipped; --force rebuilds.
    - Cells sharing a kernel-set key compile the GPU kernels once; other Pythons only bind.
    - MAX_JOBS/NVCC_THREADS come from cores, memory and measured job sizes unless given.
    - A compiler killed for memory is resumed with fewer jobs, keeping finished units.
    - Logs: <output_dir>/logs/<cell id>.log; each wheel gets <wheel>.manifest.json.
    - --python PATH builds against that interpreter's own torch (manifest build.backend "env").
    """
    console = Console(stderr=True)
    bases = parse_base_images(base_images)
    env_backend: EnvBackend | None = None
    if python is not None:
        if backend not in (None, "env"):
            raise ConfigurationError(f"--python builds with the env backend, not --backend {backend}")
        env_backend, chosen = environment_build(
            project, python, target, list(cells), profile, list(arches), kernel
        )
    elif profile or arches or kernel:
        raise ConfigurationError(
            "--kernel, --profile and --arch go with --python; a matrix build takes them from --target/--cell"
        )
    else:
        chosen = cells_to_build(project, target, list(cells))
    with ConsoleProgressView(quiet=True if quiet else None) as view:
        engine_backend: Backend = env_backend or choose_backend(
            project, backend or project.matrix.build.backend, view, bases
        )
        engine = Engine(
            project,
            engine_backend,
            view,
            force=force,
            requested=requested_settings(click.get_current_context(), max_jobs, nvcc_threads),
            memory_limit_gb=memory_limit,
        )
        if dry_run:
            for cell in chosen:
                via = engine.backend_for(cell).name
                view.log(f"{cell.id} -> {cell.wheel_name} ({via}): {engine.settings(cell, 1).line()}")
            return
        if builder_image_only:
            if not isinstance(engine_backend, DockerBackend):
                raise ConfigurationError(
                    f"--builder-image-only needs the docker backend, not {engine_backend.name}"
                )
            mine = [c for c in chosen if engine.backend_for(c) is engine_backend and c.toolkit.kind == "cuda"]
            for toolkit in sorted({c.toolkit for c in mine}, key=str):
                view.log(f"builder image {toolkit}: {engine_backend.ensure_builder(toolkit, view)}")
            return
        par = parallel_cells_of(parallel_cells, project.matrix.build.resources)  # None: from estimates
        with build_lock(engine.cache, on_wait=view.log):  # shared: `cache prune` refuses meanwhile
            results = engine.build(chosen, parallel_cells=par)
    console.print(summary_table(results))
    failed = [r for r in results if r.status == "failed"]
    for r in failed:
        console.print(f"[red]{r.cell.id}[/]: {escape(r.message)}", highlight=False)
    if failed:
        raise BuildError(f"{len(failed)} of {len(results)} cell(s) failed; logs in {engine.logs}")
