"""Time the README's main job on a fresh clone, phase by phase (``benchmarks/results/main_job.json``).

``run``: clone COMMIT into a new folder, clear what a fresh machine would not have (every Docker image and
the build cache, attnforge's, ccache's and pip's caches), then run the README's
set-up line ``bash scripts/setup-host.sh && nox -s build-wheels`` with every output line time-stamped.
``summarize``: turn that log and the cell's ``result.json`` into one RUN record: the phases with their
start and end (seconds from the start), ``cell_wall_s``, ``compile_bound_s`` = max(sum of unit seconds /
cores, longest unit), their ratio and ``total_s``.

    python benchmarks/main_job.py run --commit HEAD --workdir /tmp/mainjob-after --log after.log
    python benchmarks/main_job.py summarize --workdir /tmp/mainjob-after --log after.log --key after
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULT = REPO / "benchmarks" / "results" / "main_job.json"
COMMAND = "bash scripts/setup-host.sh && nox -s build-wheels"
CONDITIONS = (
    "fresh clone; every Docker image and the BuildKit cache removed; attnforge's, ccache's and pip's caches "
    "removed; nothing else running"
)


def fresh_machine() -> None:
    """Remove what an earlier run left: images, BuildKit cache, attnforge's, ccache's and pip's caches (the
    host's pip makes the torch venv since 2026-11-26: its cache would hold torch from an earlier run)."""
    subprocess.run(["docker", "system", "prune", "-af"], check=False, capture_output=True)
    subprocess.run(["docker", "builder", "prune", "-af"], check=False, capture_output=True)
    for cache in ("attnforge", "ccache", "pip"):
        shutil.rmtree(Path.home() / ".cache" / cache, ignore_errors=True)


def run(commit: str, workdir: Path, log: Path) -> int:
    """Clone, clean, run COMMAND with time-stamped lines into ``log``; the command's exit code."""
    if workdir.exists():
        shutil.rmtree(workdir)
    clone = workdir / "main"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    shared = REPO.parent / "shared"
    if shared.is_dir():
        shutil.copytree(shared, workdir / "shared", symlinks=True)
    fresh_machine()
    start = time.time()
    with log.open("w", encoding="utf-8") as out:
        out.write(f"# start {start:.3f} commit {commit} command {COMMAND}\n")
        proc = subprocess.Popen(
            ["bash", "-c", COMMAND], cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(f"{time.time() - start:9.2f} {line}")
            out.flush()
        code = proc.wait()
        out.write(f"# end {time.time() - start:.2f} exit {code}\n")
    return code


def stamped(log: Path) -> list[tuple[float, str]]:
    """(seconds from the start, text) for every output line of a ``run`` log."""
    out = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        head, _, text = line.strip().partition(" ")
        with contextlib.suppress(ValueError):
            out.append((float(head), text))
    return out


def first(lines: list[tuple[float, str]], pattern: str) -> float | None:
    """When the first line matching ``pattern`` was printed."""
    rx = re.compile(pattern)
    return next((t for t, text in lines if rx.search(text)), None)


def builder_windows(
    lines: list[tuple[float, str]], result: dict[str, Any], t0: float
) -> dict[str, list[float]]:
    """The builder's stages as [start, end] seconds from the run's start: from result.json's own windows, or
    (older builders) from the ``<stage> done (Ns)`` lines."""
    if result.get("stage_windows"):
        return {k: [round(t0 + a, 1), round(t0 + b, 1)] for k, (a, b) in result["stage_windows"].items()}
    out = {}
    for stage in ("source", "unpack", "venv", "compiler", "compile", "import_check"):
        end = first(lines, rf": {stage} done \(")
        if end is not None:
            out[stage] = [round(end - float(result["stages"][stage]), 1), round(end, 1)]
    return out


def summarize(workdir: Path, log: Path, commit: str) -> dict[str, Any]:
    """One RUN record from a ``run`` log and the cell's result.json."""
    lines = stamped(log)
    results = sorted((workdir / "main" / ".attnforge-cache" / "cells").glob("*/*/out/result.json"))
    result = json.loads(results[-1].read_text(encoding="utf-8"))
    end = float(re.findall(r"# end ([0-9.]+)", log.read_text(encoding="utf-8"))[-1])
    t0 = first(lines, r"building \(MAX_JOBS=") or 0.0
    stages = builder_windows(lines, result, t0)
    units = result.get("unit_times", {})
    compile_start = stages["compile"][0]
    lane = bool(result.get("kernel_lane"))
    spans = {}
    for name, u in units.items():  # ninja's unit times count from the compile stage, the lane's from t0
        base = t0 if (lane or u.get("lane")) else compile_start
        spans[name] = [round(base + u["start_s"], 1), round(base + u["end_s"], 1)]
    ahead_done = first(lines, r"torch venv .*: ready in")  # the host made the torch venv (since 9a9d437)
    phases = {
        "setup": [0.0, first(lines, r"setup-host: ready")],
        "nox venv": [first(lines, r"Creating virtual environment"), first(lines, r"nox > attnforge build")],
        "base image": [first(lines, r"bootstrapping the local base image"), first(lines, r"created in")],
        "builder image": [first(lines, r"building builder image"), first(lines, r": fetching sources")],
        "unpack": stages.get("unpack"),
        # where torch was installed: on the host while the images built (engine/venv_ahead.py), else in the cell
        "venv": [first(lines, r"torch venv .*: installing on the host"), ahead_done]
        if ahead_done
        else stages.get("venv"),
        "venv reuse check": stages.get("venv") if ahead_done else None,
        "probe": stages.get("compiler"),
        "compile": [min(s for s, _ in spans.values()), max(e for _, e in spans.values())],
        "binding": spans.get("flash_api"),
        "finalize": [first(lines, r": finalizing"), first(lines, r"-x86_64: done")],
    }
    seconds = [float(u["s"]) for u in units.values()]
    cores = int(result.get("cores") or 1)
    bound = max(sum(seconds) / cores, max(seconds))
    cell_wall = (first(lines, r"-x86_64: done") or end) - (first(lines, r": fetching sources") or 0.0)
    return {
        "commit": commit,
        "phases": {k: v for k, v in phases.items() if v and None not in v},
        "units": {k: {"s": u["s"], "window": spans[k]} for k, u in units.items()},
        "cell_wall_s": round(cell_wall, 1),
        "compile_bound_s": round(bound, 1),
        "ratio": round(cell_wall / bound, 2),
        "total_s": round(end, 1),
        "cores": cores,
        "command": COMMAND,
        "conditions": CONDITIONS,
    }


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--commit", default="HEAD")
    r.add_argument("--workdir", type=Path, required=True)
    r.add_argument("--log", type=Path, required=True)
    s = sub.add_parser("summarize")
    s.add_argument("--workdir", type=Path, required=True)
    s.add_argument("--log", type=Path, required=True)
    s.add_argument("--key", choices=["before", "after"], required=True)
    s.add_argument("--commit", required=True)
    s.add_argument("--machine", default="2 cores, 24 GiB, Debian 12, no GPU; Docker 20.10")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return run(args.commit, args.workdir, args.log.resolve())
    record = json.loads(RESULT.read_text(encoding="utf-8")) if RESULT.is_file() else {}
    record[args.key] = summarize(args.workdir, args.log, args.commit)
    record["machine"] = args.machine
    record["conditions"] = (
        "fresh clone; every Docker image and the BuildKit cache removed, attnforge's build cache new; nothing "
        "else running; pip's download cache: see each run's own conditions"
    )
    RESULT.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(record[args.key], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
