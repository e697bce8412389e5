"""MAX_JOBS/NVCC_THREADS choice from cores, memory and measured job sizes."""

from __future__ import annotations

import json
from pathlib import Path

from attnforge.engine.resources import JobMemoryTable, Machine, choose_parallelism, detect_machine


def test_two_cores_plenty_of_memory() -> None:
    p = choose_parallelism(Machine(2, 22.0, "test"), arches=1, per_arch_gb=4.5)
    assert (p.max_jobs, p.nvcc_threads) == (2, 1)
    assert p.fits and "MAX_JOBS=2" in p.reason


def test_memory_bounds_jobs_on_a_big_box() -> None:
    # the device machine: 16 cores, ~120 GiB; 4.5 GiB per arch x 2 arches per job
    p = choose_parallelism(Machine(16, 120.0, "test"), arches=2, per_arch_gb=4.5)
    assert p.nvcc_threads == 2
    assert p.max_jobs == 8  # min(16 cores / 2 threads, (120-2)/9 = 13)
    small = choose_parallelism(Machine(16, 30.0, "test"), arches=2, per_arch_gb=4.5)
    assert small.max_jobs == 3  # (30-2)/9


def test_too_little_memory_drops_threads_then_warns() -> None:
    p = choose_parallelism(Machine(4, 6.0, "test"), arches=2, per_arch_gb=4.5, reserve_gb=1.0)
    assert (p.max_jobs, p.nvcc_threads) == (1, 1)
    assert p.fits
    tight = choose_parallelism(Machine(4, 3.0, "test"), arches=1, per_arch_gb=4.5, reserve_gb=1.0)
    assert tight.max_jobs == 1 and not tight.fits and "WARNING" in tight.reason


def test_explicit_values_win() -> None:
    p = choose_parallelism(Machine(2, 8.0, "test"), arches=1, per_arch_gb=4.5, max_jobs=6, nvcc_threads=3)
    assert (p.max_jobs, p.nvcc_threads) == (6, 3)
    assert "given explicitly" in p.reason and not p.fits


def test_share_splits_the_machine() -> None:
    p = choose_parallelism(Machine(16, 120.0, "test"), arches=1, per_arch_gb=4.5, share=2)
    assert p.max_jobs == 8


def test_detect_machine_reads_this_host() -> None:
    m = detect_machine()
    assert m.cores >= 1 and m.memory_available_gb > 0


def test_measured_job_memory_overrides_packaged(tmp_path: Path) -> None:
    path = tmp_path / "job_memory.json"
    table = JobMemoryTable(path)
    assert table.per_arch_gb("cuda13.0", "full")[0] == 4.5
    table.record("cuda13.0", "lean", peak_gb=5.0, arches=2, note="test")
    again = JobMemoryTable(path)
    gb, source = again.per_arch_gb("cuda13.0", "lean")
    assert gb == 5.0 and source.startswith("measured")  # one process compiles one arch: not divided
    assert json.loads(path.read_text())["cuda13.0/lean"]["peak_gb"] == 5.0
