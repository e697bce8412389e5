"""Which backend builds a cell: CUDA cells go to the chosen one (docker/local), ROCm cells by their backend.

- ROCm Triton-profile cells: the local backend (this machine, nothing compiled: the builder runs flash-attn's
  setup.py with the Triton knobs over a CPU stand-in torch), whatever `--backend` says.
- ROCm CK cells: the `rocm-ck` backend, which refuses them before anything runs, naming what is missing
  (exit 5 without a ROCm toolchain; exit 4 where one exists, since attnforge has no CK builder yet).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from attnforge.builder.exits import EXIT_ENV
from attnforge.core.errors import BuildError, EnvironmentProblem
from attnforge.engine.backends.local import LocalBackend
from attnforge.engine.progress import ProgressView
from attnforge.engine.rocm.build_plan import backend_of
from attnforge.engine.rocm.toolchain import ck_needs
from attnforge.matrix.cell import Cell
from attnforge.matrix.project import Project

if TYPE_CHECKING:
    from attnforge.engine.jobs import Backend, CellJob

Route = Literal["default", "triton", "rocm-ck"]


def route_of(cell: Cell) -> Route:
    """`default` for CUDA cells (the chosen backend), `triton` or `rocm-ck` for ROCm cells."""
    if cell.toolkit.kind != "rocm":
        return "default"
    return "triton" if backend_of(cell) == "triton" else "rocm-ck"


class RocmCkBackend:
    """Stands for the CK builder attnforge does not have: `prepare` says why the cells cannot be built."""

    name = "rocm-ck"

    def __init__(self, project: Project) -> None:
        self.project = project
        self.pip_args: list[str] = []
        self.interpreter: str | None = None

    def identity(self) -> str:
        return json.dumps({"backend": self.name})

    def prepare(self, cells: list[Cell], view: ProgressView) -> None:
        needs = [ck_needs(c, self.project.compat) for c in cells]
        text = "\n".join(n.sentence() for n in needs)
        if any(n.missing() for n in needs):
            raise EnvironmentProblem(
                f"{len(cells)} ROCm CK cell(s) cannot be built on this machine:\n{text}",
                hint="Triton-profile cells build here; leave the CK cells out with --cell",
            )
        raise BuildError(f"attnforge cannot compile ROCm CK cells yet:\n{text}")

    def run(self, job: CellJob, on_line: Callable[[str], None]) -> int:
        on_line(f"attnforge: {job.cell.id}: no CK builder")
        return EXIT_ENV

    def cancel(self, job: CellJob) -> None:
        return None


def make_route_backend(route: Route, project: Project) -> Backend:
    """A backend for a non-default route (the engine makes each one once)."""
    if route == "triton":
        return LocalBackend()
    if route == "rocm-ck":
        return RocmCkBackend(project)
    raise ValueError(f"the {route!r} route uses the backend chosen on the command line")
