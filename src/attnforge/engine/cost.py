"""What a target costs to compile, before building: kernel sets, units to compile and compile hours from
the unit-time table, under three ways of sharing compiled kernels:

- ``shared``: kernel objects shared by every cell of a kernel set (the key leaves Python out, and torch
  too where the kernel units do not include it): one kernel compile per set, one binding per wheel (a
  stable-ABI wheel is one binding for every cell it serves);
- ``per_torch``: the key with torch in it (kernel objects shared across Pythons only);
- ``none``: every cell compiles everything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnforge.engine.schedule import CELL_OVERHEAD_S, CellEstimate, cell_estimates, makespan
from attnforge.engine.unittimes import UnitTimeTable
from attnforge.matrix.cell import Cell
from attnforge.matrix.plan import Plan


@dataclass
class SetCost:
    """One kernel set: the cells that build its wheels, the cells those wheels also serve (stable ABI), and
    what compiling it costs (seconds of one job)."""

    key: str
    cells: list[Cell]
    estimate: CellEstimate
    served: list[Cell] = field(default_factory=list)

    @property
    def wheels(self) -> int:
        """Wheels, and so bindings compiled: one per building cell."""
        return len(self.cells)

    @property
    def all_cells(self) -> list[Cell]:
        return self.cells + self.served

    @property
    def kernel_units(self) -> int:
        return len(self.estimate.units) - 1

    @property
    def kernel_s(self) -> float:
        return self.estimate.kernel_s

    @property
    def binding_s(self) -> float:
        return self.estimate.binding_s * len(self.cells)

    @property
    def compile_s(self) -> float:
        return self.kernel_s + self.binding_s


@dataclass
class Scenario:
    """Kernel sets under one way of sharing, with totals."""

    name: str
    sets: list[SetCost] = field(default_factory=list)

    @property
    def units(self) -> int:
        return sum(s.kernel_units + len(s.cells) for s in self.sets)

    @property
    def wheels(self) -> int:
        return sum(s.wheels for s in self.sets)

    @property
    def cells(self) -> int:
        return sum(len(s.all_cells) for s in self.sets)

    @property
    def compile_s(self) -> float:
        return sum(s.compile_s for s in self.sets)

    def wall_s(self, cores: int) -> float:
        """Estimated wall time on ``cores``: every set's kernel units and bindings, longest first."""
        durations = [e.s for s in self.sets for u, e in s.estimate.units.items() if u != "flash_api"]
        durations += [s.estimate.binding_s + CELL_OVERHEAD_S for s in self.sets for _ in s.cells]
        return makespan(durations, cores)

    def to_json(self, cores: int) -> dict[str, Any]:
        return {
            "kernel_sets": len(self.sets),
            "cells": self.cells,
            "wheels": self.wheels,
            "bindings": self.wheels,
            "units": self.units,
            "compile_hours": round(self.compile_s / 3600, 2),
            "wall_hours": round(self.wall_s(cores) / 3600, 2),
        }


def scenario(
    name: str,
    cells: list[Cell],
    key: Callable[[Cell], str],
    table: UnitTimeTable,
    served: dict[str, list[Cell]] | None = None,
) -> Scenario:
    """Group the building cells by ``key``; ``served`` (building cell id -> the cells its wheel also serves)
    rides along with its builder."""
    groups: dict[str, list[Cell]] = {}
    for c in cells:
        groups.setdefault(key(c), []).append(c)
    served = served or {}
    return Scenario(
        name,
        [
            SetCost(
                k,
                cs,
                CellEstimate(cell_estimates(table, cs[0])),
                [x for c in cs for x in served.get(c.id, [])],
            )
            for k, cs in groups.items()
        ],
    )


@dataclass
class PlanCost:
    """A plan's cost under the three scenarios; cells without a unit model are listed apart."""

    target: str
    cores: int
    shared: Scenario
    per_torch: Scenario
    none: Scenario
    not_estimated: list[Cell]
    factor: float
    per_torch_bindings: Scenario | None = None  # the same cells, every one with its own per-torch wheel

    @property
    def stable_abi_saves(self) -> bool:
        return self.per_torch_bindings is not None and self.per_torch_bindings.wheels > self.shared.wheels

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "cores": self.cores,
            "machine_factor": round(self.factor, 3),
            "shared": self.shared.to_json(self.cores),
            "per_torch": self.per_torch.to_json(self.cores),
            "none": self.none.to_json(self.cores),
            "without_stable_abi": self.per_torch_bindings.to_json(self.cores)
            if self.per_torch_bindings is not None and self.stable_abi_saves
            else None,
            "not_estimated": [c.id for c in self.not_estimated],
            "kernel_sets": [
                {
                    "key": s.key,
                    "cells": [c.id for c in s.all_cells],
                    "wheels": s.wheels,
                    "kernel_units": s.kernel_units,
                    "kernel_hours": round(s.kernel_s / 3600, 2),
                    "binding_hours": round(s.binding_s / 3600, 2),
                }
                for s in self.shared.sets
            ],
        }


def plan_cost(plan: Plan, table: UnitTimeTable, cores: int) -> PlanCost:
    """The cost of a plan's valid cells on ``cores`` cores of this machine (`table`'s factor)."""
    modelled = [c for c in plan.valid if cell_estimates(table, c)]
    rest = [c for c in plan.valid if c not in modelled]
    served: dict[str, list[Cell]] = {}
    for v in plan.served:
        served.setdefault(str(v.served_by), []).append(v.cell)
    every = modelled + [x for c in modelled for x in served.get(c.id, [])]
    return PlanCost(
        plan.target,
        cores,
        scenario("shared", modelled, lambda c: c.kernel_set_key, table, served),
        scenario("per_torch", modelled, lambda c: c.torch_kernel_set_key, table, served),
        scenario("none", modelled, lambda c: c.id, table, served),
        rest,
        table.factor,
        scenario("per_torch_bindings", every, lambda c: c.kernel_set_key, table),
    )
