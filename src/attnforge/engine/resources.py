"""Memory-aware parallelism: MAX_JOBS and NVCC_THREADS from cores, available memory and measured job sizes.

The rule and the machine readers live once, in `attnforge.builder.parallelism` (the builder runs them in
build containers too); this module adds the measured job sizes and the engine's longest-first planner."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from attnforge.builder.parallelism import (
    BINDING_JOB_GB,
    DEFAULT_JOB_GB,
    DEFAULT_RESERVE_GB,
    GIB,
    Machine,
    Parallelism,
    Planner,
    detect_machine,
)
from attnforge.builder.parallelism import choose_parallelism as builder_choose
from attnforge.engine.schedule import choose_threads
from attnforge.matrix.cell import Cell

__all__ = [
    "BINDING_JOB_GB",
    "GIB",
    "JobMemoryTable",
    "Machine",
    "Parallelism",
    "choose_parallelism",
    "detect_machine",
    "profile_class",
]


def profile_class(cell: Cell) -> str:
    """The job-memory row a cell's compile jobs plan with: FA3, a pruned (DISABLE_*) build, or the full one."""
    return "fa3" if cell.kernel == "flash-attn-3" else "lean" if cell.profile_spec.disable else "full"


class JobMemoryTable:
    """Peak RSS of one compile job per (toolkit, profile class), packaged and updated from real builds."""

    def __init__(self, measured_path: Path | None = None) -> None:
        packaged = resources.files("attnforge").joinpath("data/job_memory.json").read_text()
        self.rows: dict[str, dict[str, object]] = json.loads(packaged)["jobs"]
        self.measured_path = measured_path
        if measured_path and measured_path.exists():
            self.rows.update(json.loads(measured_path.read_text()))

    @staticmethod
    def key(toolkit: str, profile_class: str) -> str:
        return f"{toolkit}/{profile_class}"

    def per_arch_gb(self, toolkit: str, profile_class: str) -> tuple[float, str]:
        """GB per job per compiled arch, and where the number comes from."""
        for key in (self.key(toolkit, profile_class), self.key(toolkit.split(".")[0] + ".x", profile_class)):
            row = self.rows.get(key)
            if row:
                return float(str(row["peak_gb"])), str(row.get("source", key))
        row = self.rows["default"]
        return float(str(row["peak_gb"])), str(row.get("source", "default"))

    def for_cell(self, cell: Cell) -> tuple[float, str]:
        """GB per job per compiled arch for `cell` (its toolkit and `profile_class`), and where it comes from."""
        return self.per_arch_gb(str(cell.toolkit), profile_class(cell))

    def record(self, toolkit: str, profile_class: str, peak_gb: float, arches: int, note: str) -> None:
        """Remember a measured peak, so the next build plans with it. `peak_gb` is the largest single process:
        one cicc/ptxas, which compiles one arch (NVCC_THREADS runs one per arch at once), so it is already the
        per-arch figure whatever `arches` is (dividing by it under-planned 2-arch builds into an OOM)."""
        if not self.measured_path or peak_gb <= 0:
            return
        per_arch = round(peak_gb, 2)
        measured: dict[str, object] = {}
        if self.measured_path.exists():
            measured = json.loads(self.measured_path.read_text())
        measured[self.key(toolkit, profile_class)] = {"peak_gb": per_arch, "source": f"measured: {note}"}
        self.measured_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.measured_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(measured, indent=2, sort_keys=True))
        tmp.replace(self.measured_path)
        self.rows.update(measured)  # type: ignore[arg-type]


def _longest_first(durations: list[float], arches: int, per_arch_gb: float) -> Planner:
    def plan(cores: int, mem: float) -> tuple[int, int, str]:
        choice = choose_threads(durations, arches, cores, gb_per_thread=per_arch_gb, memory_gb=mem)
        why = f"longest-first plan of {len(durations)} unit estimates: {choice.makespan_s:.0f} s"
        return choice.jobs, choice.threads, why

    return plan


def choose_parallelism(
    machine: Machine,
    arches: int,
    per_arch_gb: float = DEFAULT_JOB_GB,
    *,
    reserve_gb: float = DEFAULT_RESERVE_GB,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    share: int = 1,
    durations: list[float] | None = None,
) -> Parallelism:
    """The builder's one chooser (`builder.parallelism.choose_parallelism`), with the engine's planner: given
    `durations` (estimated seconds of the units to compile) the split between jobs and threads is the one
    whose longest-first plan ends first (`schedule.choose_threads`)."""
    planner: Planner | None = None
    if durations:
        planner = _longest_first(durations, arches, per_arch_gb)

    return builder_choose(
        machine,
        arches,
        per_arch_gb,
        reserve_gb=reserve_gb,
        max_jobs=max_jobs,
        nvcc_threads=nvcc_threads,
        share=share,
        planner=planner,
    )
