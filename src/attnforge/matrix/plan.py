"""Expand a target of matrix.yaml into cells, check each against the rules, and summarise."""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass, field
from typing import Any

from attnforge.builder.patches import torch_free
from attnforge.core.errors import ConfigurationError, NothingToDoError
from attnforge.matrix.cell import Cell, Toolkit
from attnforge.matrix.compat import CompatData, parse_version
from attnforge.matrix.fa4_cells import KERNEL as FA4_KERNEL
from attnforge.matrix.fa4_plan import FA4Verdict, fa4_verdicts
from attnforge.matrix.rules import NEWER_RUNTIME, Problem, Verdict, check, host_compiler_problem
from attnforge.matrix.schema import AXES, Matrix, TargetSpec
from attnforge.matrix.source_lock import source_sha256

Combo = dict[str, Any]


def span(versions: set[str]) -> str:
    """{"2.6", "2.7", "2.14"} -> "2.6-2.14" (one version as it is); free-threaded Pythons are listed after
    the range of the others: {"3.10", ..., "3.14", "3.14t"} -> "3.10-3.14, 3.14t"."""
    threaded = sorted((v for v in versions if v.endswith("t")), key=lambda v: parse_version(v[:-1]))
    ordered = sorted((v for v in versions if not v.endswith("t")), key=parse_version)
    parts = [ordered[0] if len(ordered) == 1 else f"{ordered[0]}-{ordered[-1]}"] if ordered else []
    return ", ".join(parts + threaded)


@dataclass
class KernelSet:
    """Cells that link the same compiled kernel objects (one kernel-set key), and why they may."""

    key: str
    cells: list[Cell]
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "cells": [c.id for c in self.cells], "why": self.why}


@dataclass
class Plan:
    """The checked cells of one target."""

    target: str
    verdicts: list[Verdict]
    philox: dict[str, str] = field(default_factory=dict)  # torch family -> its offset_intragraph_ type
    fa4: list[FA4Verdict] = field(default_factory=list)  # flash-attn-4 cells: built by `attnforge fa4 build`

    @property
    def valid(self) -> list[Cell]:
        """The cells to build: valid, one per wheel (those `served_by` another cell's wheel left out)."""
        return [v.cell for v in self.verdicts if v.valid and v.served_by is None]

    @property
    def served(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.valid and v.served_by is not None]

    @property
    def invalid(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.valid]

    def kernel_sets(self) -> dict[str, list[Cell]]:
        groups: dict[str, list[Cell]] = {}
        for c in self.valid:
            groups.setdefault(c.kernel_set_key, []).append(c)
        return groups

    def shared_kernels(self) -> list[KernelSet]:
        """The kernel sets with the reason their cells share kernel objects."""
        return [KernelSet(key, cells, self._why(cells)) for key, cells in self.kernel_sets().items()]

    def _why(self, cells: list[Cell]) -> str:
        c = cells[0]
        torch, python = span({x.torch_family for x in cells}), span({x.python for x in cells})
        if c.pure_python:
            return f"no compiled kernels (pure-Python wheel): torch {torch}, Python {python}"
        if c.stable_abi and not c.torch_free_kernels:
            return (
                f"stable-ABI kernels (torch >= {c.torch_floor}): one wheel for torch {torch}, Python {python}"
            )
        if not c.torch_free_kernels:
            return f"kernel units include torch {torch}: shared by its Pythons ({python}) only"
        patch = next(p for p in c.patches if torch_free([p]))
        by_layout: dict[str, set[str]] = {}
        for x in cells:
            if not x.stable_abi:
                by_layout.setdefault(self.philox.get(x.torch_family, "not recorded"), set()).add(
                    x.torch_family
                )
        layouts = ", ".join(
            f"{ty} in {span(fams)}"
            for ty, fams in sorted(by_layout.items(), key=lambda kv: min(parse_version(f) for f in kv[1]))
        )
        stable = sorted({f"torch >= {x.torch_floor}" for x in cells if x.stable_abi})
        per_torch = [x for x in cells if not x.stable_abi]
        if not per_torch:
            return (
                f"kernel units without torch (patch '{patch}'), linked by the stable-ABI binding: one wheel for "
                f"{', '.join(stable)} x Python >= {c.abi3_python}"
            )
        stable_part = f"; also the stable-ABI wheel for {', '.join(stable)}" if stable else ""
        torch = span({x.torch_family for x in per_torch})
        python = span({x.python for x in per_torch})
        return (
            f"kernel units without torch (patch '{patch}'), shared by torch {torch} x Python {python}"
            f"{stable_part}; the binding converts each torch's Philox state to the kernels' own "
            f"(offset_intragraph_: {layouts})"
        )

    def wheels_by_kernel(self) -> dict[str, int]:
        """How many wheels each kernel needs (a stable-ABI wheel counts once however many cells it serves)."""
        out: dict[str, int] = {}
        for c in self.valid:
            out[c.kernel] = out.get(c.kernel, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "cells": len(self.verdicts),
            "valid": len(self.valid) + len(self.served),
            "invalid": len(self.invalid),
            "wheels": len(self.valid),
            "served_by_another_wheel": len(self.served),
            "wheels_by_kernel": self.wheels_by_kernel(),
            "kernel_sets": len(self.kernel_sets()),
            "variants": sorted({c.variant for c in self.valid}),
        } | ({"fa4_cells": len(self.fa4)} if self.fa4 else {})

    def to_json(self) -> dict[str, Any]:
        cells = []
        for v in self.verdicts:
            row = v.cell.to_json()
            row["valid"] = v.valid
            row["served_by"] = v.served_by
            row["reasons"] = v.reasons()
            row["notes"] = v.notes
            cells.append(row)
        kernel_sets = [k.to_json() for k in self.shared_kernels()]
        fa4 = [v.to_json() for v in self.fa4]
        return {"summary": self.summary(), "cells": cells, "kernel_sets": kernel_sets, "fa4_cells": fa4}


def _norm_arch(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _matches(combo: Combo, entry: Combo) -> bool:
    for key, want in entry.items():
        have = combo.get(key)
        if key == "arch":
            if _norm_arch(have) != _norm_arch(want):
                return False
        elif have != want:
            return False
    return True


def expand(target: TargetSpec, defaults: Combo) -> list[Combo]:
    """GitHub Actions' matrix semantics: product of axes, minus exclude, then include (extend or add)."""
    axes = {k: v for k, v in target.matrix.model_dump().items() if v is not None}
    names = list(axes)
    combos: list[Combo] = [
        dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values())
    ]
    if not axes:
        combos = []
    excludes = [e.given() for e in target.exclude]
    combos = [c for c in combos if not any(_matches(c, e) for e in excludes)]
    for entry in (i.given() for i in target.include):
        original = {k: v for k, v in entry.items() if k in axes}
        extra = {k: v for k, v in entry.items() if k not in axes}
        extended = False
        for combo in combos:
            if _matches(combo, original):
                combo.update(extra)
                extended = True
        if not extended:
            combos.append(dict(entry))
    full: list[Combo] = []
    for combo in combos:
        missing = [a for a in AXES if a not in combo and a not in defaults]
        if missing:
            raise ConfigurationError(
                f"target '{target.description or '?'}': a cell has no value for {', '.join(missing)}: "
                "add the axis to the target's matrix or to top-level 'defaults'"
            )
        full.append({**defaults, **combo})
    # a combination listed twice (e.g. by include) is one cell
    unique: dict[str, Combo] = {}
    for combo in full:
        unique.setdefault(repr(sorted((k, str(v)) for k, v in combo.items())), combo)
    return list(unique.values())


def resolve_torch(version: str, data: CompatData) -> str:
    """'2.8' means the family's latest patch release."""
    row = data.torch_release(version)
    if row is None or version.count(".") >= 2:
        return version
    return row.latest


def make_cell(
    combo: Combo, matrix: Matrix, data: CompatData, lock: dict[str, Any], abi: str = "torch"
) -> Cell:
    """Turn one combination of axis values into a Cell (not yet checked); `abi` is its target's."""
    kernel = combo["kernel"]
    if kernel not in matrix.kernels:
        raise ConfigurationError(f"kernel '{kernel}' is used by a target but not declared under 'kernels'")
    profile = combo["profile"]
    if profile not in matrix.profiles:
        guess = difflib.get_close_matches(profile, list(matrix.profiles), n=1)
        hint = f"; did you mean '{guess[0]}'?" if guess else f"; declared: {', '.join(matrix.profiles)}"
        raise ConfigurationError(
            f"profile '{profile}' is used by a target but not declared under 'profiles'{hint}"
        )
    spec = matrix.kernels[kernel]
    return Cell(
        kernel=kernel,
        kernel_version=spec.version,
        toolkit=Toolkit.parse(combo["toolkit"]),
        torch=resolve_torch(str(combo["torch"]), data),
        python=str(combo["python"]),
        cxx11_abi=bool(combo["cxx11_abi"]),
        arches=_norm_arch(combo["arch"]),
        profile=profile,
        platform=combo["platform"],
        profile_spec=matrix.profiles[profile],
        source_sha256=source_sha256(kernel, spec, data, lock),
        source_kind=spec.source.kind,
        abi_request=abi,
    )


def plan_target(matrix: Matrix, target: str, data: CompatData, lock: dict[str, Any] | None = None) -> Plan:
    """Expand and check one target. Unknown target or an empty expansion is an error."""
    if target not in matrix.targets:
        guess = difflib.get_close_matches(target, list(matrix.targets), n=1)
        hint = f"did you mean '{guess[0]}'?" if guess else f"targets: {', '.join(matrix.targets)}"
        raise ConfigurationError(f"no target named '{target}' in the matrix ({hint})")
    spec = matrix.targets[target]
    combos = expand(spec, matrix.defaults.given())
    fa4 = fa4_verdicts([c for c in combos if c["kernel"] == FA4_KERNEL], matrix.fa4)
    combos = [c for c in combos if c["kernel"] != FA4_KERNEL]
    if not combos and not fa4:
        raise NothingToDoError(
            f"target '{target}' expands to no cell (check its matrix, include and exclude)"
        )
    verdicts = [check(make_cell(c, matrix, data, lock or {}, spec.abi), data) for c in combos]
    verdicts.sort(key=lambda v: v.cell.id)
    reject_same_wheel(verdicts, data)
    reject_unsupported_host_compiler(verdicts, matrix.build.base_images, data)
    philox = {t.family: t.philox_offset_intragraph for t in data.torch if t.philox_offset_intragraph}
    return Plan(target, verdicts, philox, fa4)


def reject_unsupported_host_compiler(
    verdicts: list[Verdict], base_images: dict[str, str], data: CompatData
) -> None:
    """Rule `host-compiler` at plan time, for the base a CUDA cell declares: `build.base_images`, else the compat
    table's `nvidia/cuda:<ver>-devel` image (what the generated workflows build on). Bases this machine picks
    for itself (`local_base`, `--base-image`) are checked by the docker backend before anything compiles."""
    for v in verdicts:
        tk = v.cell.toolkit
        row = data.cuda_toolkit(tk.version) if tk.kind == "cuda" else None
        image = base_images.get(str(tk)) or (row.devel_image if row else None)
        if not v.valid or row is None or not image:
            continue
        problem = host_compiler_problem(tk, image, data)
        if problem is not None:
            v.problems.append(problem)
            continue
        base_os = data.os_of_image(image)
        if base_os is not None and row.max_gcc is not None and base_os.gcc_default > row.max_gcc:
            pick = max(n for n in base_os.gcc if n <= row.max_gcc)
            v.notes.append(
                f"{image}'s g++ {base_os.gcc_default} is newer than CUDA {tk.version} accepts: the builder image "
                f"gets g++-{pick} and builds with it"
            )


def reject_same_wheel(verdicts: list[Verdict], data: CompatData | None = None) -> None:
    """A valid cell whose wheel file name an earlier valid cell already produces is invalid (rule
    `same-wheel`): it would overwrite that wheel. Pure-Python wheels (ROCm Triton, `py3-none-any`) do not
    depend on the Python version, so a Triton profile declared for two Pythons is one wheel.

    Stable-ABI cells (one cp310-abi3 wheel for every torch >= the floor and every Python >= 3.10) are
    meant to share a file: the cells of one wheel are all valid; one builds it, the others are `served_by`
    that cell. The builder is a cell whose torch's plain-PyPI wheel has the cell's CUDA (installable without
    PyTorch's own index), then the oldest torch (closest to the floor), then the oldest Python."""

    def newer_runtime(v: Verdict) -> bool:
        return any(n.startswith(NEWER_RUNTIME) for n in v.notes)

    def rank(v: Verdict) -> tuple[bool, bool, Any, Any]:
        t = data.torch_release(v.cell.torch) if data else None
        on_pypi = t is not None and t.pypi_cuda == v.cell.toolkit.version
        return (newer_runtime(v), not on_pypi, parse_version(v.cell.torch), parse_version(v.cell.python))

    stable: dict[str, list[Verdict]] = {}
    for v in verdicts:
        if v.valid and v.cell.stable_abi:
            stable.setdefault(v.cell.wheel_name, []).append(v)
    for group in stable.values():
        builder = min(group, key=rank)
        if newer_runtime(builder):  # no torch of this lane to compile the wheel against
            for v in group:
                v.problems.append(
                    Problem(
                        "torch-toolkit",
                        f"no torch release has CUDA {v.cell.toolkit.version} (or older) builds of its major "
                        "to compile this stable-ABI wheel against",
                    )
                )
            continue
        for v in group:
            if v is not builder:
                v.served_by = builder.cell.id
                v.notes.append(f"same stable-ABI wheel as {builder.cell.id}: built once")
    first: dict[str, str] = {}
    for v in verdicts:
        if not v.valid or v.cell.stable_abi:
            continue
        name = v.cell.wheel_name
        if name in first:
            v.problems.append(
                Problem(
                    "same-wheel",
                    f"builds the same file as {first[name]} ({name}); declare one Python for this profile",
                )
            )
        else:
            first[name] = v.cell.id


def select_cells(plan: Plan, cell_ids: list[str]) -> list[Cell]:
    """The valid cells to act on: all of them, or those named with --cell (an invalid one is an error)."""
    by_id = {v.cell.id: v for v in plan.verdicts}
    if not cell_ids:
        if not plan.valid and plan.fa4 and not plan.verdicts:
            raise NothingToDoError(
                f"target '{plan.target}' has FA4 cells only: `attnforge fa4 build` on a GPU"
            )
        if not plan.valid:
            reasons = "; ".join(f"{v.cell.id}: {v.reasons()[0]}" for v in plan.invalid[:3])
            raise NothingToDoError(f"target '{plan.target}' has no valid cell ({reasons})")
        return plan.valid
    chosen: list[Cell] = []
    for cid in cell_ids:
        v = by_id.get(cid)
        if v is None:
            guess = difflib.get_close_matches(cid, list(by_id), n=1)
            hint = f"; did you mean '{guess[0]}'?" if guess else " (see `attnforge plan`)"
            raise ConfigurationError(f"no cell '{cid}' in target '{plan.target}'{hint}")
        if not v.valid:
            raise ConfigurationError(f"cell '{cid}' is impossible: {'; '.join(v.reasons())}")
        cell = by_id[v.served_by].cell if v.served_by else v.cell  # a stable-ABI wheel: its builder
        if cell not in chosen:
            chosen.append(cell)
    return chosen
