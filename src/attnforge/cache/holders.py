"""What running builders hold: the cache paths named in the spec of every `incontainer.py` process.

A builder runs as `python incontainer.py --spec SPEC` on the host (local backend) or in a container
(docker backend, which mounts the cache at the same path and whose processes the host's /proc shows),
so the spec's paths are host paths either way. This covers builds that do not take the build lock
(older attnforge versions, a builder started by hand).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BUILDER_SCRIPT = "incontainer.py"
# spec fields naming cache paths (BuildSpec's names and incontainer.py's own)
PATH_FIELDS = (
    *("build_dir", "out_dir", "output_dir", "venv_dir"),
    *("objects_dir", "kernel_objects_dir", "sdist", "ccache_dir"),
)


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
        if any(a.endswith(BUILDER_SCRIPT) for a in args) and "--spec" in args[:-1]:
            specs.append(Path(args[args.index("--spec") + 1]))
    return specs


def _spec_paths(spec: dict[str, Any]) -> list[Path]:
    paths = [Path(str(spec[k])) for k in PATH_FIELDS if spec.get(k)]
    source = spec.get("source")
    if isinstance(source, dict) and source.get("path"):
        paths.append(Path(str(source["path"])))
    ccache = spec.get("ccache")
    if isinstance(ccache, dict) and ccache.get("dir"):
        paths.append(Path(str(ccache["dir"])))
    return paths


def held_paths(proc: Path = Path("/proc")) -> tuple[set[Path], set[str]]:
    """(paths, cell ids) of running builders: each spec's folder and the cache paths it names."""
    paths: set[Path] = set()
    cells: set[str] = set()
    for spec_path in builder_spec_paths(proc):
        paths.add(spec_path.parent)
        try:
            spec = json.loads(spec_path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(spec, dict):
            paths.update(_spec_paths(spec))
            if spec.get("cell_id"):
                cells.add(str(spec["cell_id"]))
    return paths, cells


def overlaps(path: Path, held: set[Path]) -> bool:
    """True when `path` is, contains or lies inside a held path."""
    return any(path == h or path in h.parents or h in path.parents for h in held)
