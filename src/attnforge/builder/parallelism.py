"""The one MAX_JOBS/NVCC_THREADS chooser: cores and memory this process may use (cgroup limits included)
and the rule that fits jobs x threads x per-arch memory into them.

The host asks it through its one resolver (`attnforge.engine.settings.resolve_settings`: every backend, NGC
images, ROCm builds, the runner checks); the builder itself only when a spec written by hand carries no
settings and no ``max_jobs`` (`builder_settings`). It is stdlib only, because the builder runs it inside
build containers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .settings import FROM_AUTO, BuildSettings

GIB = 1024**3
MAX_JOBS_PER_CORE = 4  # explicit MAX_JOBS above cores x this is capped (matrix.yaml refuses above 1,024)
DEFAULT_JOB_GB = 4.5  # one flash-attn compile job per arch, when nothing measured says otherwise
DEFAULT_RESERVE_GB = 2.0  # memory left to the rest of the machine
# the binding (flash_api.cpp, host code against torch's headers) beside a kernel lane's MAX_JOBS compilers:
# it peaked at 1.83 GiB with torch 2.14.1 (2 cores, benchmarks/results/main_job.json); kept with a margin
BINDING_JOB_GB = 2.5

# (cores, memory GiB) -> (jobs, threads, why): a planner that splits the machine (engine.schedule's)
Planner = Callable[[int, float], tuple[int, int, str]]


@dataclass(frozen=True)
class Machine:
    """What a build may use: CPUs and memory (cgroup limits included)."""

    cores: int
    memory_available_gb: float
    memory_limit_source: str

    def describe(self) -> str:
        return (
            f"{self.cores} cores, {self.memory_available_gb:.1f} GiB available ({self.memory_limit_source})"
        )


@dataclass(frozen=True)
class Parallelism:
    """The choice, with the sentence that explains it (logged with every build)."""

    max_jobs: int
    nvcc_threads: int
    job_memory_gb: float
    reason: str
    fits: bool = True
    why: str = ""  # the rule that set MAX_JOBS (the bracketed end of `reason`)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit() -> float | None:
    """CPUs allowed by the cgroup (v2 cpu.max or v1 cfs quota), None when unlimited."""
    v2 = _read("/sys/fs/cgroup/cpu.max")
    if v2:
        quota, _, period = v2.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    quota_s, period_s = (
        _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    )
    if quota_s and period_s and int(quota_s) > 0:
        return int(quota_s) / int(period_s)
    return None


def cgroup_memory_free() -> float | None:
    """Bytes the cgroup may still allocate: limit minus its working set (usage less the inactive file cache
    the kernel reclaims before it OOM-kills, as the kubelet and ``docker stats`` count it); None when
    unlimited. Without that, a container that has just written a torch venv looks gigabytes fuller than it is."""
    for limit_p, usage_p, stat_p, cache_key in (
        (
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/memory.current",
            "/sys/fs/cgroup/memory.stat",
            "inactive_file",
        ),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            "/sys/fs/cgroup/memory/memory.stat",
            "total_inactive_file",
        ),
    ):
        limit, usage = _read(limit_p), _read(usage_p)
        if limit is None or usage is None or limit == "max":
            continue
        lim = int(limit)
        if lim >= 1 << 60:  # v1 "unlimited"
            continue
        inactive = 0
        for line in (_read(stat_p) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == cache_key and value.strip().isdigit():
                inactive = int(value)
        return float(max(0, lim - max(0, int(usage) - inactive)))
    return None


def meminfo_available() -> float:
    """MemAvailable from /proc/meminfo in bytes (what the kernel can give without swapping)."""
    text = _read("/proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return float(int(line.split()[1]) * 1024)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def detect_machine() -> Machine:
    """Cores and memory this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_limit()
    if quota is not None:
        cores = max(1, min(cores, math.floor(quota)))
    avail = meminfo_available()
    source = "MemAvailable"
    cg = cgroup_memory_free()
    if cg is not None and cg < avail:
        avail, source = cg, "cgroup limit"
    return Machine(cores=cores, memory_available_gb=avail / GIB, memory_limit_source=source)


def choose_parallelism(
    machine: Machine,
    arches: int,
    per_arch_gb: float = DEFAULT_JOB_GB,
    *,
    reserve_gb: float = DEFAULT_RESERVE_GB,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    share: int = 1,
    planner: Planner | None = None,
) -> Parallelism:
    """Pick MAX_JOBS/NVCC_THREADS so that jobs x threads x per-arch memory fits, never oversubscribing cores.

    nvcc's --threads compiles the arches of one unit in parallel, so a job's memory grows with it.
    Explicit values (matrix, environment or command line) win; `share` splits the machine between parallel
    cells. A `planner` (given cores and memory, used only when neither value is explicit) picks the split
    between jobs and threads itself (the engine's longest-first plan of unit estimates).
    """
    cores = max(1, machine.cores // share)
    mem = max(0.0, (machine.memory_available_gb - reserve_gb) / share)
    threads = nvcc_threads or max(1, min(arches, 4, cores))
    if planner is not None and max_jobs is None and nvcc_threads is None:
        jobs, threads, why = planner(cores, mem)
    elif max_jobs is not None and max_jobs > cores * MAX_JOBS_PER_CORE:
        jobs = cores * MAX_JOBS_PER_CORE
        why = (
            f"MAX_JOBS {max_jobs:,} given, capped at {MAX_JOBS_PER_CORE} per core: every compile job needs a "
            "core, more only wait and hold memory"
        )
    elif max_jobs is not None:
        jobs = max_jobs
        why = "MAX_JOBS given explicitly"
    else:
        job_gb = per_arch_gb * min(threads, arches)
        by_mem = math.floor(mem / job_gb) if job_gb > 0 else cores
        jobs = max(1, min(max(1, cores // threads), by_mem))
        why = f"min(cores/threads={max(1, cores // threads)}, memory/job={by_mem})"
    job_gb = per_arch_gb * min(threads, arches)
    fits = jobs * job_gb <= mem + 1e-9
    if not fits and nvcc_threads is None and threads > 1:
        threads, job_gb = 1, per_arch_gb
        fits = jobs * job_gb <= mem + 1e-9
    reason = (
        f"{machine.describe()}, reserve {reserve_gb:g} GiB, {job_gb:.1f} GiB per job "
        f"({per_arch_gb:.1f} per arch x {min(threads, arches)}) -> MAX_JOBS={jobs} NVCC_THREADS={threads} [{why}]"
    )
    if not fits:
        reason += (
            f"; WARNING: {jobs} job(s) need {jobs * job_gb:.1f} GiB, more than the {mem:.1f} GiB available"
        )
    return Parallelism(jobs, threads, job_gb, reason, fits, why)


def builder_settings(
    given: BuildSettings | None,
    max_jobs: int | None,
    nvcc_threads: int,
    job_mem_gb: float = DEFAULT_JOB_GB,
    *,
    pure_python: bool = False,
) -> BuildSettings:
    """The settings the builder runs with, asked once per build: the host's (``spec.settings``) when the spec
    carries them; else the spec's own ``max_jobs``; else measured here, min(cores, memory / job) for one job
    of ``job_mem_gb`` (no reserve: the engine kept one outside). A Triton build compiles nothing: 1 job."""
    if pure_python:
        base = given or BuildSettings(1, 1, 0.0, sources=(("max_jobs", "spec"), ("nvcc_threads", "spec")))
        return base if base.max_jobs == 1 else base.adjusted("nothing is compiled (Triton)", max_jobs=1)
    if given is not None:
        return given
    spec_said = (("job_memory_gb", "spec"), ("nvcc_threads", "spec"))
    if max_jobs:
        return BuildSettings(
            max(1, int(max_jobs)), nvcc_threads, job_mem_gb, sources=(("max_jobs", "spec"), *spec_said)
        )
    machine = detect_machine()
    par = choose_parallelism(machine, 1, job_mem_gb, reserve_gb=0.0, nvcc_threads=1)
    measured = f"{FROM_AUTO} in the builder: {machine.describe()} / {job_mem_gb:g} GiB per job"
    return BuildSettings(
        par.max_jobs, nvcc_threads, job_mem_gb, par.reason, par.fits, (("max_jobs", measured), *spec_said)
    )
