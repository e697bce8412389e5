"""`attnforge runner check`: is this machine fit to be a self-hosted GPU runner for a matrix target?"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console

from attnforge.cli.runner_view import render
from attnforge.core.errors import EnvironmentProblem, TestFailure
from attnforge.core.kernels import KERNELS
from attnforge.matrix.cell import Cell
from attnforge.matrix.project import Project
from attnforge.runner.check_report import SmokeRequest, run_checks
from attnforge.runner.checks import CheckOptions
from attnforge.runner.host import Host, ReplayHost, SystemHost


@click.group("runner")
def command() -> None:
    """Self-hosted GPU runners: check a machine before registering it."""


@command.command("check")
@click.option("--target", "-t", default="default", show_default=True, help="Matrix target the runner tests.")
@click.option(
    "--matrix",
    "matrix_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Matrix file (same as the global --matrix). Without one, cell checks are skipped.",
)
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here."
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Build/cache folder whose disk is checked (default: build.cache_dir of the matrix).",
)
@click.option(
    "--min-free-gb", type=click.FloatRange(0), default=50.0, show_default=True, help="Disk threshold."
)
@click.option(
    "--docker-image",
    envvar="ATTNFORGE_RUNNER_IMAGE",
    metavar="IMAGE",
    help="A local image with nvidia-smi (or rocminfo) to test the GPU container runtime (env ATTNFORGE_RUNNER_IMAGE).",
)
@click.option("--require-docker", is_flag=True, help="Docker problems block (default: warnings).")
@click.option(
    "--python",
    "pythons",
    multiple=True,
    metavar="EXE",
    help="Interpreter with the machine's torch (repeatable; default: this one, then python3 on PATH).",
)
@click.option(
    "--smoke-wheel",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Install this flash-attn wheel into a fresh venv and compare it with SDPA on each GPU.",
)
@click.option("--smoke-index", metavar="URL", help="As --smoke-wheel, with flash-attn from this index.")
@click.option(
    "--smoke-kernel",
    type=click.Choice(KERNELS),
    default="flash-attn",
    show_default=True,
    help="With --smoke-index: the project to install (flash-attn-3 runs flash_attn_interface).",
)
@click.option(
    "--cxx-probe/--no-cxx-probe",
    default=True,
    show_default=True,
    help="Check that C++ exceptions from code this machine's compiler builds reach Python (about a minute).",
)
@click.option(
    "--replay",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    hidden=True,
    help="Answer from a recorded scenario folder (one file per probe) instead of this machine.",
)
@click.pass_obj
def check(
    project: Project,
    target: str,
    matrix_path: Path | None,
    json_path: Path | None,
    cache_dir: Path | None,
    min_free_gb: float,
    docker_image: str | None,
    require_docker: bool,
    pythons: tuple[str, ...],
    smoke_wheel: Path | None,
    smoke_index: str | None,
    smoke_kernel: str,
    cxx_probe: bool,
    replay: Path | None,
) -> None:
    """Check driver, GPUs, Docker, disk, cores and memory against the cells of a target; print the labels.

    \b
    Blocking (exit 5): no GPU, no cell testable here (driver or arch), /dev/kfd unusable (AMD),
    too little disk. A failed smoke run exits 6. Docker problems are warnings unless --require-docker.
    Example: attnforge runner check --matrix matrix.yaml --target default --json runner_check.json
    """
    if matrix_path is not None:
        project = Project(matrix_path, project.compat_path)
    host: Host = ReplayHost(replay) if replay else SystemHost()
    cells: list[Cell] = []
    note = ""
    reserve = 2.0
    cache = cache_dir
    target_name: str | None = None
    if project.matrix_path.exists():
        cells = project.plan(target).valid
        target_name = target
        cache = cache or project.path(project.matrix.build.cache_dir)
        reserve = project.matrix.build.resources.reserve_memory_gb
    else:
        note = f"no matrix at {project.matrix_path}: cell checks skipped"
    candidates = list(pythons) or [sys.executable, "python3"]
    opts = CheckOptions(
        target=target_name,
        cells=cells,
        compat=project.compat if cells else None,
        cache_dir=cache or Path(".attnforge-cache"),
        min_free_gb=min_free_gb,
        docker_image=docker_image,
        require_docker=require_docker,
        pythons=list(dict.fromkeys(candidates)),
        reserve_memory_gb=reserve,
        matrix_note=note,
        cxx_probe=cxx_probe and replay is None,
    )
    report = run_checks(host, opts, SmokeRequest(smoke_wheel, smoke_index, smoke_kernel))
    render(report, Console())
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
        click.echo(f"report: {json_path}", err=True)
    blocking = report.blocking
    if not blocking:
        return
    names = ", ".join(c.name for c in blocking)
    if all(c.name == "smoke" for c in blocking):
        raise TestFailure(f"smoke run failed: {report.smoke.detail}")
    raise EnvironmentProblem(f"{len(blocking)} blocking problem(s): {names}")
