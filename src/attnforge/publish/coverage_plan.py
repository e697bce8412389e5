"""What the matrix plans, as the coverage page needs it: every cell of every target, valid or refused and why.

The snapshot is taken when `attnforge publish` runs next to a matrix.yaml and stored in the index
(`coverage.json`, key `plan`), so a later change of the index without the matrix (a yank) keeps showing it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from attnforge.core.errors import AttnforgeError
from attnforge.matrix.plan import Plan
from attnforge.matrix.project import Project


@dataclass(frozen=True)
class PlannedCell:
    """One cell of a target's plan: the wheel it would build, or the rules that refuse it."""

    cell_id: str
    target: str
    kernel: str
    kernel_version: str
    profile: str
    toolkit: str  # cuda13.0 | rocm6.4
    torch: str  # the release it builds against (2.14.1)
    python: str  # 3.11
    cxx11_abi: bool
    platform: str
    arches: tuple[str, ...]
    variant: str
    wheel: str
    refused: tuple[str, ...] = ()  # "[rule] message" for each broken rule; empty: valid
    torch_floor: str | None = None  # a stable-ABI wheel: the oldest torch it serves
    abi3_python: str | None = None  # ... and the oldest CPython
    served_by: str | None = None  # another cell builds the same (stable-ABI) wheel

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["arches"] = list(self.arches)
        data["refused"] = list(self.refused)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlannedCell:
        fields = dict(data)
        fields["arches"] = tuple(fields.get("arches") or ())
        fields["refused"] = tuple(fields.get("refused") or ())
        return cls(**fields)


@dataclass
class PlanSnapshot:
    """Every planned cell of a matrix, and the targets that could not be planned (with why)."""

    source: str
    cells: list[PlannedCell]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "cells": [c.to_json() for c in self.cells], "notes": self.notes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanSnapshot:
        return cls(
            source=str(data.get("source") or ""),
            cells=[PlannedCell.from_json(c) for c in data.get("cells") or []],
            notes=[str(n) for n in data.get("notes") or []],
        )


def _cells(plan: Plan) -> list[PlannedCell]:
    out = []
    for v in plan.verdicts:
        c = v.cell
        out.append(
            PlannedCell(
                cell_id=c.id,
                target=plan.target,
                kernel=c.kernel,
                kernel_version=c.kernel_version,
                profile=c.profile,
                toolkit=str(c.toolkit),
                torch=c.torch,
                python=c.python,
                cxx11_abi=c.cxx11_abi,
                platform=c.platform,
                arches=tuple(c.arches),
                variant=c.variant,
                wheel=c.wheel_name,
                refused=tuple(v.reasons()),
                torch_floor=c.torch_floor,
                abi3_python=c.abi3_python,
                served_by=v.served_by,
            )
        )
    return out


def snapshot(project: Project) -> PlanSnapshot | None:
    """Plan every target of the project's matrix (None when there is no matrix to read).

    A cell in several targets is listed once (its first valid appearance, else its first); a target that
    cannot be planned is named in `notes` and left out.
    """
    try:
        targets = list(project.matrix.targets)
    except AttnforgeError:
        return None
    by_id: dict[str, PlannedCell] = {}
    notes: list[str] = []
    for target in targets:
        try:
            cells = _cells(project.plan(target))
        except AttnforgeError as exc:
            notes.append(f"target {target}: not planned: {exc}")
            continue
        for cell in cells:
            seen = by_id.get(cell.cell_id)
            if seen is None or (seen.refused and not cell.refused):
                by_id[cell.cell_id] = cell
    return PlanSnapshot(source=str(project.matrix_path), cells=list(by_id.values()), notes=notes)
