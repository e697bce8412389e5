"""Scheduling from estimated unit times (`unittimes`): which units a cell compiles, longest-processing-time
(LPT) list scheduling of units over compile jobs, nvcc threads for multi-arch builds, how many kernel sets
to build at once, and the order in which an engine starts cells.

Model: ninja starts units in the given order whenever a job is free; a unit with A arches compiled with T
nvcc threads takes ``d * (SERIAL + (1 - SERIAL) / min(T, A))`` (nvcc's --threads runs the per-arch
back ends in parallel; the front end and host compile stay serial).
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass

from attnforge.core.kernels import head_dims as kernel_head_dims
from attnforge.engine.unittimes import BINDING_UNIT, Estimate, UnitTimeTable, flags_of
from attnforge.matrix.cell import Cell

SERIAL = 0.15  # share of a unit's compile that nvcc --threads does not parallelise (model)
CELL_OVERHEAD_S = 45.0  # per cell besides compiling: setup.py start, link, wheel, import check, finalize


def cell_units(cell: Cell) -> list[str]:
    """The units (file stems) a flash-attn 2 cell compiles from scratch: the binding, then its kernel units
    (profile's head dims x dtypes x causal/not x fwd, fwd_split and, unless disabled, bwd); [] for kernels
    without a unit model (FA3, ROCm, Triton)."""
    if cell.kernel != "flash-attn" or cell.toolkit.kind != "cuda" or cell.pure_python:
        return []
    spec = cell.profile_spec
    dims = spec.head_dims or list(kernel_head_dims("flash-attn"))
    dtypes = spec.dtypes or ["fp16", "bf16"]
    kinds = ["fwd", "fwd_split"] + ([] if "backward" in spec.disable else ["bwd"])
    units = [BINDING_UNIT]
    for kind in kinds:
        for d in sorted(dims):
            for dt in dtypes:
                for causal in ("", "_causal"):
                    units.append(f"flash_{kind}_hdim{d}_{dt}{causal}_sm80")
    return units


def cell_estimates(table: UnitTimeTable, cell: Cell, units: list[str] | None = None) -> dict[str, Estimate]:
    """Each unit's estimate for this cell (its toolkit, arch count and profile flags)."""
    flags = flags_of(cell.profile_spec.disable)
    return {
        u: table.estimate(cell.kernel, cell.kernel_version, str(cell.toolkit), u, len(cell.arches), flags)
        for u in (cell_units(cell) if units is None else units)
    }


def threaded(seconds: float, threads: int, arches: int) -> float:
    """A unit's time with nvcc --threads (see the module docstring)."""
    return seconds * (SERIAL + (1.0 - SERIAL) / max(1, min(threads, arches)))


def list_schedule(durations: list[float], jobs: int) -> list[tuple[float, float]]:
    """(start, end) of each unit when they start in this order on ``jobs`` parallel jobs."""
    free = [0.0] * max(1, jobs)
    heapq.heapify(free)
    out = []
    for d in durations:
        start = heapq.heappop(free)
        out.append((start, start + d))
        heapq.heappush(free, start + d)
    return out


def makespan(durations: list[float], jobs: int, lpt: bool = True) -> float:
    """Wall time of compiling these units on ``jobs`` jobs (longest first when ``lpt``)."""
    order = sorted(durations, reverse=True) if lpt else list(durations)
    return max((end for _, end in list_schedule(order, jobs)), default=0.0)


@dataclass(frozen=True)
class ThreadChoice:
    jobs: int
    threads: int
    makespan_s: float


def choose_threads(
    durations: list[float],
    arches: int,
    cores: int,
    max_jobs_by_memory: int | None = None,
    gb_per_thread: float = 0.0,
    memory_gb: float | None = None,
) -> ThreadChoice:
    """Jobs x nvcc threads (jobs * threads <= cores) with the shortest LPT makespan; on a tie, fewer threads.
    One arch: threads do not help. Few long units on many cores: threads shorten the tail."""
    best: ThreadChoice | None = None
    for threads in range(1, max(1, min(arches, cores)) + 1):
        jobs = max(1, cores // threads)
        if memory_gb is not None and gb_per_thread > 0:
            jobs = max(1, min(jobs, int(memory_gb // (gb_per_thread * threads))))
        if max_jobs_by_memory is not None:
            jobs = max(1, min(jobs, max_jobs_by_memory))
        span = makespan([threaded(d, threads, arches) for d in durations], jobs)
        if best is None or span < best.makespan_s * 0.98:
            best = ThreadChoice(jobs, threads, span)
    assert best is not None
    return best


def choose_parallel_cells(lead_units: list[list[float]], cores: int) -> int:
    """How many kernel sets to compile at once: the count whose LPT plan over the sets (each with
    cores // count jobs) ends first. Sets with few units leave cores idle alone; many sets share them."""
    if len(lead_units) <= 1:
        return 1
    best, best_span = 1, float("inf")
    for count in range(1, min(len(lead_units), cores) + 1):
        jobs = max(1, cores // count)
        times = [makespan(units, jobs) + CELL_OVERHEAD_S for units in lead_units]
        span = makespan(times, count)
        if span < best_span * 0.98:
            best, best_span = count, span
    return best


@dataclass(frozen=True)
class CellEstimate:
    """A cell's compile estimate: its units (estimates), the kernel units' share and the binding's."""

    units: dict[str, Estimate]

    @property
    def kernel_s(self) -> float:
        return sum(e.s for u, e in self.units.items() if u != BINDING_UNIT)

    @property
    def binding_s(self) -> float:
        e = self.units.get(BINDING_UNIT)
        return e.s if e else 0.0

    def durations(self, kernels: bool = True) -> list[float]:
        return [e.s for u, e in self.units.items() if kernels or u == BINDING_UNIT]


def plan_eta(order: list[tuple[str, float]], jobs: int, finished: dict[str, float], elapsed: float) -> float:
    """Seconds left in a compile whose units start in ``order`` (name, estimated seconds) on ``jobs`` jobs.

    The plan's clock is scaled by how the finished units ran (median of actual / planned end, seconds
    since the compile started); a compile past its scaled plan gets half its unfinished work per job.
    """
    plan = list_schedule([d for _, d in order], jobs)
    ends = {name: end for (name, _), (_, end) in zip(order, plan, strict=True)}
    ratios = [finished[n] / ends[n] for n in finished if n in ends and ends[n] > 0]
    scale = statistics.median(ratios) if ratios else 1.0
    span = max((end for _, end in plan), default=0.0)
    left = [d for name, d in order if name not in finished]
    if not left:
        return 0.0
    planned = scale * span - elapsed
    return planned if planned > 0 else 0.5 * scale * sum(left) / max(1, jobs)
