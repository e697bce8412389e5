"""FA4 cells of a target: the combinations whose `kernel` is ``flash-attn-4``, each with its kernel wheel's
variant and file name, or the FA4 rules that refuse it (``matrix/fa4_cells.py``).

An FA4 cell is (CUDA major, torch floor, Python, GPU arch): FA4 is pure Python, so a target's C++ ABI,
profile and platform do not make another FA4 cell, and an arch list gives one cell per arch (the arch is part
of FA4's compile key, so every arch is its own kernel wheel)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from attnforge.matrix.fa4_cells import KERNEL, Cell, cells, rules, wheel_name
from attnforge.matrix.fa4_section import FA4Section
from attnforge.names import cuda_version, fa4_local

_SM = re.compile(r"^sm_(\d+)[a-z]?$")


@dataclass
class FA4Verdict:
    """One FA4 cell of a target: valid, or refused with ``[rule-id] reason`` lines."""

    id: str
    cell: Cell | None  # None when the toolkit or arch names no CUDA cell at all
    problems: list[str] = field(default_factory=list)
    variant: str = "-"
    wheel: str = "-"
    served_by: str | None = None  # a cell of an older torch whose wheel this one installs

    @property
    def valid(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kernel": KERNEL,
            "variant": self.variant,
            "wheel": self.wheel if self.valid else None,
            "valid": self.valid,
            "served_by": self.served_by,
            "reasons": self.problems,
        }


def _family(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _verdicts(combo: dict[str, Any], section: FA4Section | None) -> list[FA4Verdict]:
    toolkit, torch, python = str(combo["toolkit"]), str(combo["torch"]), str(combo["python"])
    arches = [combo["arch"]] if isinstance(combo["arch"], str) else list(combo["arch"])
    out = []
    for arch in arches:
        cuda, sm = cuda_version(toolkit), _SM.match(arch)
        cu = re.fullmatch(r"(\d+)\.\d+", cuda or "")
        if cu is None or sm is None:
            what = f"toolkit {toolkit}" if cu is None else f"arch {arch}"
            out.append(
                FA4Verdict(
                    f"fa4-{toolkit}-torch{torch}-py{python}-{arch}",
                    None,
                    [f"[fa4-cuda] FA4 runs on NVIDIA GPUs with CUDA only, not {what}"],
                )
            )
            continue
        cell = Cell(int(cu.group(1)), _family(torch), _family(python), int(sm.group(1)))
        if section is None:
            problems = ["[fa4-stack] matrix.yaml has no fa4 section (its stack pins what FA4 cells install)"]
        else:
            problems = rules(cell, section.cuda_majors)
        out.append(_verdict(cell, problems, section))
    return out


def _verdict(cell: Cell, problems: list[str], section: FA4Section | None) -> FA4Verdict:
    verdict = FA4Verdict(cell.id, cell, problems)
    if section is not None and not problems:
        verdict.variant = fa4_local(section.version, cell.cuda_major, cell.arch).local_version
        verdict.wheel = wheel_name(section.version, cell)
    return verdict


def grid(section: FA4Section) -> list[FA4Verdict]:
    """Every FA4 cell FA4 could have (CUDA major x torch floor x Python x arch), checked against the rules
    with the section's stack (`attnforge fa4 plan`)."""
    return _share_wheels([_verdict(c, why, section) for c, why in cells(section.cuda_majors)])


def fa4_verdicts(combos: list[dict[str, Any]], section: FA4Section | None) -> list[FA4Verdict]:
    """The FA4 cells of a target's ``flash-attn-4`` combinations, one per id, sorted by id."""
    unique: dict[str, FA4Verdict] = {}
    for combo in combos:
        for v in _verdicts(combo, section):
            unique.setdefault(v.id, v)
    return _share_wheels(sorted(unique.values(), key=lambda v: v.id))


def _share_wheels(verdicts: list[FA4Verdict]) -> list[FA4Verdict]:
    """The kernel wheel does not depend on torch (FA4's fingerprint does not hash it): cells that differ only
    in torch install one wheel, built by the cell of the oldest torch; the others are `served_by` it."""
    first: dict[str, FA4Verdict] = {}
    for v in sorted(
        (v for v in verdicts if v.valid and v.cell), key=lambda v: v.cell.torch if v.cell else (0, 0)
    ):
        builder = first.setdefault(v.wheel, v)
        if builder is not v:
            v.served_by = builder.id
    return verdicts
