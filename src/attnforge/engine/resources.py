"""Memory-aware parallelism: MAX_JOBS and NVCC_THREADS from cores, available memory and measured job sizes."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

GIB = 1024**3


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
    """Bytes the cgroup may still allocate (limit - usage), None when unlimited."""
    for limit_p, usage_p in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, usage = _read(limit_p), _read(usage_p)
        if limit is None or usage is None or limit == "max":
            continue
        lim = int(limit)
        if lim >= 1 << 60:  # v1 "unlimited"
            continue
        return float(max(0, lim - int(usage)))
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


def choose_parallelism(
    machine: Machine,
    arches: int,
    per_arch_gb: float,
    *,
    reserve_gb: float = 2.0,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    share: int = 1,
    durations: list[float] | None = None,
) -> Parallelism:
    """Pick MAX_JOBS/NVCC_THREADS so that jobs x threads x per-arch memory fits, never oversubscribing cores.

    nvcc's --threads compiles the arches of one unit in parallel, so a job's memory grows with it.
    Explicit values (matrix or environment) win; `share` splits the machine between parallel cells. With
    `durations` (estimated seconds of the units to compile) the split between jobs and threads is the one
    whose longest-first plan ends first (`schedule.choose_threads`).
    """
    cores = max(1, machine.cores // share)
    mem = max(0.0, (machine.memory_available_gb - reserve_gb) / share)
    threads = nvcc_threads or max(1, min(arches, 4, cores))
    if durations and max_jobs is None and nvcc_threads is None:
        from attnforge.engine.schedule import choose_threads

        choice = choose_threads(durations, arches, cores, gb_per_thread=per_arch_gb, memory_gb=mem)
        jobs, threads = choice.jobs, choice.threads
        why = f"longest-first plan of {len(durations)} unit estimates: {choice.makespan_s:.0f} s"
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
    return Parallelism(jobs, threads, job_gb, reason, fits)
