"""Run every runner check and assemble the report (JSON keys: device, driver, gpus, checks, smoke);
the human view is attnforge.cli.runner_view."""

from __future__ import annotations

import datetime as dt
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnforge.runner.checks import (
    Check,
    CheckOptions,
    check_arches,
    check_cells,
    check_disk,
    check_docker,
    check_driver,
    check_gpus,
    check_kfd,
    check_nox,
    check_torch,
    choose_jobs,
    labels_for,
    probe_torch,
    testable_cells,
)
from attnforge.runner.compiler_check import check_compiler
from attnforge.runner.gpu_smoke import SmokeResult, run_smoke
from attnforge.runner.gpus import Discovery, discover
from attnforge.runner.host import Host

SCHEMA = 1


@dataclass
class SmokeRequest:
    """--smoke-wheel / --smoke-index."""

    wheel: Path | None = None
    index_url: str | None = None
    kernel: str = "flash-attn"  # the project to install from the index (flash-attn-3: flash_attn_interface)

    @property
    def asked(self) -> bool:
        return self.wheel is not None or self.index_url is not None


@dataclass
class RunnerReport:
    """Everything the check found; `blocking` decides the exit code."""

    found: Discovery
    checks: list[Check]
    smoke: SmokeResult
    labels: list[str]
    max_jobs: int | None
    nvcc_threads: int | None
    target: str | None
    cells: int
    testable: list[str]
    torch: dict[str, Any] = field(default_factory=dict)
    date: str = ""

    @property
    def blocking(self) -> list[Check]:
        return [c for c in self.checks if c.blocking]

    @property
    def device(self) -> str:
        if not self.found.gpus:
            return "no GPU"
        names: dict[str, int] = {}
        for g in self.found.gpus:
            names[g.name] = names.get(g.name, 0) + 1
        return ", ".join(f"{n}x {name}" for name, n in sorted(names.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "device": self.device,
            "driver": self.found.driver or None,
            "gpus": [g.to_json() for g in self.found.gpus],
            "checks": [c.to_json() for c in self.checks],
            "smoke": self.smoke.to_json(),
            "ok": not self.blocking,
            "vendor": self.found.vendor,
            "driver_cuda": self.found.driver_cuda or None,
            "labels": self.labels,
            "max_jobs": self.max_jobs,
            "nvcc_threads": self.nvcc_threads,
            "target": self.target,
            "cells": self.cells,
            "testable_cells": self.testable,
            "torch": self.torch,
            "notes": self.found.notes,
            "host": {"platform": platform.platform(), "python": platform.python_version()},
            "date": self.date,
        }


def run_checks(host: Host, opts: CheckOptions, smoke: SmokeRequest | None = None) -> RunnerReport:
    """Probe the machine through `host` and decide every check (smoke last, only when asked)."""
    found = discover(host)
    checks: list[Check] = [check_gpus(found)]
    driver_checks, majors = check_driver(found, opts.cells, opts.compat)
    checks.extend(driver_checks)
    checks.extend(check_arches(found, opts.cells))
    testable = testable_cells(found, opts.cells, majors)
    checks.append(check_cells(opts, found, testable))
    checks.extend(check_kfd(host, found))
    checks.extend(check_docker(host, found, opts))
    checks.append(check_disk(host, opts))
    resources, par = choose_jobs(host, opts)
    checks.append(resources)
    probe = probe_torch(host, opts.pythons)
    checks.append(check_torch(probe, testable, found))
    checks.append(check_nox(host))
    if opts.cxx_probe:
        checks.append(check_compiler(str(probe["executable"]) if probe.get("torch") else None))
    labels = labels_for(host, found, majors)
    checks.append(Check("labels", "pass", ", ".join(labels)))
    result = SmokeResult()
    if smoke is not None and smoke.asked:
        python = str(probe.get("executable") or (opts.pythons[0] if opts.pythons else "python3"))
        site = [str(p) for p in probe.get("site") or []] if probe.get("venv") else []
        result = run_smoke(
            host, python, wheel=smoke.wheel, index_url=smoke.index_url, base_site=site, kernel=smoke.kernel
        )
        failed = result.failed > 0 or not result.ran
        checks.append(Check("smoke", "fail" if failed else "pass", result.detail, blocking=failed))
    return RunnerReport(
        found=found,
        checks=checks,
        smoke=result,
        labels=labels,
        max_jobs=par.max_jobs if par else None,
        nvcc_threads=par.nvcc_threads if par else None,
        target=opts.target,
        cells=len(opts.cells),
        testable=[c.id for c in testable],
        torch=probe,
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
