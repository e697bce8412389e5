"""One MAX_JOBS/NVCC_THREADS chooser (`attnforge.builder.parallelism`), asked through the one resolver
(`engine.settings.resolve_settings`): the engine (docker, local and env backends all take `Engine.settings`),
NGC images, ROCm builds and the runner checks; the builder only for a spec without settings. The same
inputs get the same answer on every path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from attnforge.builder import parallelism
from attnforge.engine import resources
from attnforge.engine import settings as settings_mod
from attnforge.engine.backends.local import LocalBackend
from attnforge.engine.progress import PlainProgressView
from attnforge.engine.rocm.build_plan import rocm_parallelism
from attnforge.engine.run import Engine
from attnforge.engine.settings import Requested
from attnforge.images.ngc_image import ngc_settings
from attnforge.matrix.cell import Cell
from attnforge.matrix.project import Project
from attnforge.runner.checks import CheckOptions, choose_jobs

ROOT = Path(__file__).resolve().parents[2]
MACHINE = parallelism.Machine(12, 40.0, "test")


class FixedHost:
    def machine(self) -> parallelism.Machine:
        return MACHINE


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[Any, ...], dict[str, Any], Any]]:
    """Every call of the one chooser, with its answer."""
    real = parallelism.choose_parallelism
    seen: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []

    def spy(*args: Any, **kw: Any) -> parallelism.Parallelism:
        out = real(*args, **kw)
        seen.append((args, kw, out))
        return out

    monkeypatch.setattr(parallelism, "choose_parallelism", spy)
    monkeypatch.setattr(settings_mod, "choose_parallelism", spy)
    monkeypatch.setattr(parallelism, "detect_machine", lambda: MACHINE)
    return seen


def _cuda_cell(project: Project) -> Cell:
    return project.plan("default").valid[0]


def _project_with_own_cache(tmp_path: Path) -> Project:
    """The checkout's matrix.yaml with a build cache of the test's own: the engine's job-memory table is read
    from the cache, and the checkout's cache holds whatever this machine's builds learned."""
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["build"]["cache_dir"] = str(tmp_path / "cache")
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return Project(tmp_path / "matrix.yaml")


def test_every_path_asks_the_one_chooser(calls: list[Any], tmp_path: Path) -> None:
    project = _project_with_own_cache(tmp_path)
    cell = _cuda_cell(project)
    rocm = next(c for c in project.plan("release").valid if c.toolkit.kind == "rocm" and not c.pure_python)

    engine = Engine(project, LocalBackend(), PlainProgressView(), requested=Requested.of(3, 1))
    engine.machine = lambda: MACHINE  # type: ignore[method-assign]
    answers = {
        "engine": engine.settings(cell, share=1),
        "ngc": ngc_settings(cell, Requested.of(3), machine=MACHINE),
        "rocm": rocm_parallelism(rocm, machine=MACHINE),
        "runner": choose_jobs(FixedHost(), CheckOptions("default", [cell], None, tmp_path))[1],
    }
    builder_jobs = parallelism.builder_settings(None, None, 1, 4.5).max_jobs
    assert len(calls) == 5  # one question per path, all to the same function
    same = ("max_jobs", "nvcc_threads", "job_memory_gb", "fits", "reason")
    for (_args, _kw, out), (path, answer) in zip(calls, answers.items(), strict=False):
        assert [getattr(out, k) for k in same] == [getattr(answer, k) for k in same], path
    assert calls[-1][2].max_jobs == builder_jobs

    # the same inputs -> the same answer, whichever path asks
    assert [getattr(answers["engine"], k) for k in same] == [getattr(answers["ngc"], k) for k in same]
    direct = parallelism.choose_parallelism(MACHINE, len(cell.arches), answers["runner"].job_memory_gb)
    assert [getattr(answers["runner"], k) for k in same] == [getattr(direct, k) for k in same]
    assert builder_jobs == min(MACHINE.cores, int(MACHINE.memory_available_gb // 4.5)) == 8


def test_ngc_job_memory_comes_from_the_table_not_a_constant() -> None:
    project = Project(ROOT / "matrix.yaml")
    cell = _cuda_cell(project)
    par = ngc_settings(cell, Requested.of(2), machine=MACHINE)
    per_arch, _src = resources.JobMemoryTable().for_cell(cell)
    assert (par.max_jobs, par.nvcc_threads, par.job_memory_gb) == (2, 1, per_arch)
