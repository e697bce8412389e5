"""What running builders hold: the cache paths named in the spec of every builder process.

A builder runs as `python -m attnforge.builder --spec SPEC` on the host (local and env backends) or
`python -m builder --spec SPEC` in a container (docker backend, which mounts the cache at the same path and
whose processes the host's /proc shows), so the spec's paths are host paths either way. This covers
builds that do not take the build lock (a builder started by hand).
"""

from __future__ import annotations

from pathlib import Path

from attnforge.builder.exits import BuildFailure
from attnforge.builder.spec import BuildSpec

BUILDER_MODULES = ("attnforge.builder", "builder")  # `python -m <module> --spec SPEC`


def builder_spec_paths(proc: Path = Path("/proc")) -> list[Path]:
    """The --spec file of every running builder process."""
    specs: list[Path] = []
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        module = args[args.index("-m") + 1] if "-m" in args[:-1] else None
        if module in BUILDER_MODULES and "--spec" in args[:-1]:
            specs.append(Path(args[args.index("--spec") + 1]))
    return specs


def held_paths(proc: Path = Path("/proc")) -> tuple[set[Path], set[str]]:
    """(paths, cell ids) of running builders: each spec's folder and the cache paths it names."""
    paths: set[Path] = set()
    cells: set[str] = set()
    for spec_path in builder_spec_paths(proc):
        paths.add(spec_path.parent)
        try:
            spec = BuildSpec.load(spec_path)
        except BuildFailure:
            continue
        paths.update(spec.paths())
        cells.add(spec.cell_id)
    return paths, cells


def overlaps(path: Path, held: set[Path]) -> bool:
    """True when `path` is, contains or lies inside a held path."""
    return any(path == h or path in h.parents or h in path.parents for h in held)
