"""The one place a cell's build settings are resolved: MAX_JOBS, NVCC_THREADS and job memory, each from the
first of the command line, the environment, the matrix (`build.resources`), then measured/auto (the job
memory table, this machine's cores and memory, the longest-first plan of unit estimates).

Every path asks `resolve_settings` once per cell: the engine's docker, local and env backends, ROCm builds,
NGC image builds and the runner checks. The answer, a frozen `BuildSettings`, travels in the builder's spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnforge.builder.parallelism import Machine, Parallelism, Planner, choose_parallelism
from attnforge.builder.settings import FROM_AUTO, FROM_COMMAND_LINE, FROM_MATRIX, BuildSettings
from attnforge.engine.resources import JobMemoryTable
from attnforge.engine.schedule import choose_threads
from attnforge.matrix.cell import Cell
from attnforge.matrix.schema import ResourcesSpec

__all__ = ["Given", "Requested", "parallel_cells_of", "resolve_settings"]

TRITON = "triton backend: no device code is compiled at build time"
BINDING_ONLY = "binding only (kernel objects of its kernel set reused): 1 job"
HIPCC = "hipcc compiles a unit's arches one after the other (no --threads)"


@dataclass(frozen=True)
class Given:
    """A value given outside the matrix, and where (`settings.FROM_COMMAND_LINE` or `FROM_ENVIRONMENT`)."""

    value: int
    source: str


@dataclass(frozen=True)
class Requested:
    """What the command line or the environment asked for; None = ask the matrix, then measure."""

    max_jobs: Given | None = None
    nvcc_threads: Given | None = None

    @classmethod
    def of(
        cls, max_jobs: int | None = None, nvcc_threads: int | None = None, source: str = FROM_COMMAND_LINE
    ) -> Requested:
        """The values given (None = not given), all from `source`."""
        return cls(
            Given(max_jobs, source) if max_jobs else None,
            Given(nvcc_threads, source) if nvcc_threads else None,
        )


def parallel_cells_of(given: int | None, resources: ResourcesSpec) -> int | None:
    """Kernel sets compiled at once: `--parallel-cells`, then the matrix; None = the engine plans it from unit
    estimates (`schedule.choose_parallel_cells`)."""
    count, _source = _count(Given(given, FROM_COMMAND_LINE) if given else None, resources.parallel_cells)
    return count


def _longest_first(durations: list[float], arches: int, per_arch_gb: float) -> Planner:
    """The split between jobs and nvcc threads whose longest-first plan of `durations` ends first."""

    def plan(cores: int, mem: float) -> tuple[int, int, str]:
        choice = choose_threads(durations, arches, cores, gb_per_thread=per_arch_gb, memory_gb=mem)
        why = f"longest-first plan of {len(durations)} unit estimates: {choice.makespan_s:.0f} s"
        return choice.jobs, choice.threads, why

    return plan


def _count(given: Given | None, matrix: int | str) -> tuple[int | None, str]:
    """A count from the first that has it: command line/environment, then the matrix; (None, "") = auto."""
    if given is not None:
        return given.value, given.source
    if matrix != "auto":
        return int(matrix), FROM_MATRIX
    return None, ""


def _fixed(value: int, why: str, memory_gb: float, memory_from: str) -> BuildSettings:
    sources = (("job_memory_gb", memory_from), ("max_jobs", why), ("nvcc_threads", why))
    return BuildSettings(value, 1, memory_gb, f"{why} -> MAX_JOBS={value}", True, sources)


def resolve_settings(
    cell: Cell,
    resources: ResourcesSpec,
    requested: Requested | None = None,
    *,
    machine: Machine,
    table: JobMemoryTable,
    share: int = 1,
    reserve_gb: float | None = None,
    durations: list[float] | None = None,
    binding_only: bool = False,
    threads: tuple[int, str] | None = None,
) -> BuildSettings:
    """`cell`'s settings on `machine`, each from command line, environment (`requested`), the matrix's
    `resources`, then measured/auto. `share` splits the machine between cells built at once; `reserve_gb`
    (default: the matrix's) is left to the rest of the machine; `durations` (estimated unit seconds) let the
    longest-first plan split cores between jobs and nvcc threads; `threads` is the path's own NVCC_THREADS
    (value, why) when nothing above gives one (ROCm: hipcc has none; an NGC image build compiles with one)."""
    asked = requested or Requested()
    if cell.pure_python:
        return _fixed(1, TRITON, 0.0, TRITON)
    if resources.memory_per_job_gb != "auto":
        per_arch, memory_from = float(resources.memory_per_job_gb), FROM_MATRIX
    else:
        rocm = cell.toolkit.kind == "rocm"
        per_arch, row = table.per_arch_gb(str(cell.toolkit), "full") if rocm else table.for_cell(cell)
        memory_from = f"{FROM_AUTO}: {row}"
    if binding_only:
        return _fixed(1, BINDING_ONLY, per_arch, memory_from)
    if cell.toolkit.kind == "rocm" and threads is None:
        threads = (1, HIPCC)
    jobs, jobs_from = _count(asked.max_jobs, resources.max_jobs)
    nthreads, threads_from = _count(asked.nvcc_threads, resources.nvcc_threads)
    if nthreads is None and threads is not None:
        nthreads, threads_from = threads
    planner = None
    if durations and jobs is None and nthreads is None:
        planner = _longest_first(durations, len(cell.arches), per_arch)
    reserve = resources.reserve_memory_gb if reserve_gb is None else reserve_gb
    par = choose_parallelism(
        machine,
        len(cell.arches),
        per_arch,
        reserve_gb=reserve,
        max_jobs=jobs,
        nvcc_threads=nthreads,
        share=share,
        planner=planner,
    )
    return _settled(par, machine, reserve, share, (jobs_from, threads_from, memory_from))


def _settled(
    par: Parallelism, machine: Machine, reserve: float, share: int, given: tuple[str, str, str]
) -> BuildSettings:
    """The chooser's answer with each value's source: what was given, else what the chooser measured."""
    jobs_from, threads_from, memory_from = given
    shared = f", 1/{share} of it" if share > 1 else ""
    measured = f"{machine.describe()}{shared}, reserve {reserve:g} GiB, {par.job_memory_gb:.1f} GiB per job"
    sources = (
        ("job_memory_gb", memory_from),
        ("max_jobs", jobs_from or f"{FROM_AUTO}: {par.why}; {measured}"),
        ("nvcc_threads", threads_from or f"{FROM_AUTO}: min(arches, 4, cores), 1 when memory is short"),
    )
    if not threads_from and "longest-first" in par.why:
        sources = (*sources[:2], ("nvcc_threads", f"{FROM_AUTO}: {par.why}"))
    return BuildSettings(par.max_jobs, par.nvcc_threads, par.job_memory_gb, par.reason, par.fits, sources)
