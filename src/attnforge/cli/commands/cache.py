"""`attnforge cache`: what the build cache holds (`du`) and removing what is old or least used (`prune`)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from attnforge.cache import docker_items
from attnforge.cache.build_lock import build_running, prune_lock
from attnforge.cache.holders import held_paths
from attnforge.cache.prune import plan_prune, remove_empty_kernel_set, remove_entry
from attnforge.cache.scan import scan
from attnforge.cache.units import format_size, parse_duration, parse_size
from attnforge.cache.usage_report import Membership, age, by_kind, docker_json, entry_json, ordered
from attnforge.cli.cache_tables import docker_table, entries_table, kinds_table
from attnforge.core.docker_cli import docker_executable
from attnforge.core.errors import AttnforgeError, ConfigurationError, EnvironmentProblem
from attnforge.matrix.project import Project


def _dir_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--output-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Build output folder whose logs/ and staging leftovers count too (default: build.output_dir).",
    )(f)
    return click.option(
        "--cache-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="The cache folder (default: build.cache_dir of the matrix).",
    )(f)


def _folders(project: Project, cache_dir: Path | None, output_dir: Path | None) -> tuple[Path, Path | None]:
    """(cache, output): the options, else the matrix's build.cache_dir and build.output_dir."""
    if cache_dir is not None and output_dir is not None:
        return cache_dir.resolve(), output_dir.resolve()
    try:
        build = project.matrix.build
    except AttnforgeError:
        if cache_dir is None:
            raise
        return cache_dir.resolve(), None
    cache = cache_dir.resolve() if cache_dir else project.path(build.cache_dir)
    return cache, output_dir.resolve() if output_dir else project.path(build.output_dir)


def _membership(project: Project) -> Membership | None:
    """The cells and kernel-sets of every target of the matrix; None when the matrix does not load."""
    cells: set[str] = set()
    keys: set[str] = set()
    try:
        targets = list(project.matrix.targets)
    except AttnforgeError:
        return None
    for target in targets:
        try:
            plan = project.plan(target)
        except AttnforgeError:
            continue
        cells.update(c.id for c in plan.valid)
        keys.update(c.kernel_set_key for c in plan.valid)
    return Membership(frozenset(cells), frozenset(keys))


def _docker_inventory(docker: str) -> list[docker_items.DockerItem]:
    if not Path(docker).exists():
        raise EnvironmentProblem(f"--docker: no Docker CLI at {docker}")
    return docker_items.inventory(docker)


@click.group("cache")
def command() -> None:
    """Inspect and prune the build cache (sources, venvs, build trees, kernel objects, logs).

    \b
      attnforge cache du                          what is there, by kind, with ages and owners
      attnforge cache prune --max-size 20G        least recently used first, down to 20 GiB
      attnforge cache prune --older-than 7d -n    what would go (--dry-run)
    """


@command.command("du")
@_dir_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of tables.")
@click.option(
    "--docker", "with_docker", is_flag=True, help="Also list attnforge's images and build containers."
)
@click.pass_obj
def du_cmd(
    project: Project, cache_dir: Path | None, output_dir: Path | None, as_json: bool, with_docker: bool
) -> None:
    """Show every cache entry: kind, size, last use, and the cells and kernel-set it belongs to."""
    cache, output = _folders(project, cache_dir, output_dir)
    now = time.time()
    entries = ordered(scan(cache, output))
    matrix = _membership(project)
    items = _docker_inventory(docker_executable()) if with_docker else []
    if as_json:
        data: dict[str, Any] = {
            "cache_dir": str(cache),
            "output_dir": str(output) if output else None,
            "total_bytes": sum(e.size for e in entries),
            "prunable_bytes": sum(e.size for e in entries if e.prunable),
            "build_running": build_running(cache),
            "by_kind": by_kind(entries),
            "entries": [entry_json(e, now, matrix) for e in entries],
        }
        if with_docker:
            data["docker"] = [docker_json(i) for i in items]
        click.echo(json.dumps(data, indent=2))
        return
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)  # logs: no folding
    if not entries:
        console.print(f"{cache}: empty (nothing cached yet)")
    else:
        base = Path(os.path.commonpath([cache, output])) if output else cache.parent
        base = cache.parent if base == Path(base.anchor) else base  # unrelated folders: not relative to /
        console.print(entries_table(entries, now, matrix, base))
        console.print(kinds_table(entries, now))
    if with_docker:
        console.print(docker_table(items) if items else "Docker: no attnforge images or build containers")


@command.command("prune")
@_dir_options
@click.option(
    "--max-size",
    metavar="SIZE",
    help="Remove least recently used entries until the total is at most SIZE (20G).",
)
@click.option("--older-than", metavar="AGE", help="Remove entries unused for longer than AGE (7d, 12h, 2w).")
@click.option("--dry-run", "-n", is_flag=True, help="Show what would be removed; remove nothing.")
@click.option(
    "--docker",
    "with_docker",
    is_flag=True,
    help="Also remove stopped build containers and dangling attnforge images.",
)
@click.pass_obj
def prune_cmd(
    project: Project,
    cache_dir: Path | None,
    output_dir: Path | None,
    max_size: str | None,
    older_than: str | None,
    dry_run: bool,
    with_docker: bool,
) -> None:
    """Remove old and least recently used cache entries; the lock file and job_memory.json stay.

    Refuses while a build runs on the same cache (builds hold <cache>/.build.lock); entries named by a
    running builder process are never removed either. SIZE: 20G = 20 GiB (powers of 1024, like du -h),
    20GB = 20*10^9 bytes.
    """
    limit = parse_size(max_size) if max_size is not None else None
    age_s = parse_duration(older_than) if older_than is not None else None
    if limit is None and age_s is None and not with_docker:
        raise ConfigurationError("cache prune: give --max-size and/or --older-than (or --docker)")
    cache, output = _folders(project, cache_dir, output_dir)
    console = Console(highlight=False, soft_wrap=True)
    if dry_run:
        _prune(console, cache, output, limit, age_s, dry_run=True)
    else:
        with prune_lock(cache):
            _prune(console, cache, output, limit, age_s, dry_run=False)
    if with_docker:
        _prune_docker(console, dry_run)


def _prune(
    console: Console,
    cache: Path,
    output: Path | None,
    limit: int | None,
    age_s: float | None,
    *,
    dry_run: bool,
) -> None:
    if limit is None and age_s is None:
        return
    now = time.time()
    paths, cells = held_paths()
    plan = plan_prune(
        scan(cache, output), now=now, max_size=limit, older_than=age_s, held_paths=paths, held_cells=cells
    )
    verb = "would remove" if dry_run else "removed"
    if dry_run and build_running(cache):
        console.print(f"[yellow]a build is running with {cache}: a real prune would refuse now[/]")
    gone, failed = [], []
    for e in plan.remove:
        if not dry_run:
            try:
                remove_entry(e)
                remove_empty_kernel_set(e)
            except OSError as exc:
                failed.append(f"{e.path}: {exc}")
                continue
        gone.append(e)
        console.print(f"{verb} {e.kind:<10} {format_size(e.size):>6}  unused {age(e, now):>4}  {e.path}")
    for e in plan.held:
        console.print(f"kept (a running build uses it): {e.kind} {e.path}")
    after = plan.total_before - sum(e.size for e in gone)
    console.print(
        f"{'dry run: ' if dry_run else ''}{verb} {len(gone)} {'entry' if len(gone) == 1 else 'entries'}, {format_size(plan.total_before - after)}; "
        f"total {format_size(plan.total_before)} -> {format_size(after)}"
    )
    if limit is not None and after > limit:
        console.print(
            f"[yellow]still above {format_size(limit)}: the rest is in use or kept (state, unknown files)[/]"
        )
    if failed:
        raise EnvironmentProblem("could not remove:\n" + "\n".join(failed))


def _prune_docker(console: Console, dry_run: bool) -> None:
    docker = docker_executable()
    garbage = [i for i in _docker_inventory(docker) if i.garbage]
    failed: list[str] = []
    for item in garbage:
        reason = None if dry_run else docker_items.remove(docker, item)
        if reason:
            failed.append(f"{item.kind} {item.id}: {reason}")
            continue
        verb = "would remove" if dry_run else "removed"
        console.print(f"{verb} docker {item.kind} {item.id} {item.name}")
    if not garbage:
        console.print("Docker: no stopped build containers or dangling attnforge images")
    if failed:
        raise EnvironmentProblem("Docker refused to remove:\n" + "\n".join(failed))
