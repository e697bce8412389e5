"""A new torch release served without a compile, timed from a fresh clone (``benchmarks/results/new_torch.json``).

Set-up (not timed): clone COMMIT, copy the previous round's stable-ABI (abi3) wheel with its manifest and records
into the clone's ``wheels/`` and publish it (``attnforge publish --to local``); the previous round's compat data is
the packaged tables without torch 2.15's rows (``tests/unit/compat_reduced.py``: no torch 2.15, CPython 3.15 or
CUDA 13.2), kept as ``prev-compat.toml``. Then, each step timed:

1. ``attnforge compat refresh --write`` against the package index (``--snapshot FILE``: a recorded one): torch
   2.15's rows written into that overlay;
2. ``attnforge plan`` of a target over torch 2.14 and 2.15 (CUDA 13.0, ``abi: stable``, the wheel's profile): the
   torch 2.15 cells served by the published abi3 wheel, nothing to build;
3. the CPU import/trace check under torch 2.15: a fresh venv with ``torch==2.15.0`` from the package index (the
   site's torch cap bypassed for it alone: ``PIP_CONSTRAINT=/dev/null``) and the wheel, then
   ``attnforge parity trace``;
4. ``attnforge publish --to local`` of the same wheel, now with its torch check;
5. ``attnforge which --torch 2.15`` against the index: the same file.

``compiled_units`` counts the kernel units any step compiled (build manifests written during the run): the goal is 0.

    python benchmarks/new_torch.py --wheel PREV/flash_attn-...-cp310-abi3-....whl --python python3.12 \\
        --workdir /tmp/newtorch --out benchmarks/results/new_torch.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TORCH = "2.15.0"
TARGET = """
  new-torch:
    description: the previous round's abi3 lane, now with torch 2.15 (benchmarks/new_torch.py)
    abi: stable
    matrix:
      toolkit: [cuda{cuda}]
      torch: ["2.14", "2.15"]
      python: ["3.11", "3.12"]
      arch: [{arches}]
      profile: [{profile}]
"""


def sh(cmd: list[str], cwd: Path, env: dict[str, str], steps: list[dict[str, Any]] | None = None) -> str:
    """Run one command (timed when `steps` is given); its stdout is returned, a failure stops the run."""
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = round(time.monotonic() - t0, 1)
    shown = " ".join(cmd).replace(str(cwd) + "/", "")
    print(f"[{wall:7.1f}s] rc={proc.returncode} {shown}", flush=True)
    if steps is not None:
        steps.append({"command": shown, "wall_s": wall, "rc": proc.returncode})
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"step failed: {shown}")
    return proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--wheel", type=Path, required=True, help="the previous round's abi3 wheel (records beside it)"
    )
    ap.add_argument("--python", default="python3.12", help="the interpreter of the torch 2.15 venv")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--commit", help="what to clone (default: this checkout's HEAD)")
    ap.add_argument("--trusted-key", type=Path, help="the public key the wheel's records are signed with")
    ap.add_argument(
        "--snapshot", type=Path, help="read this recorded index snapshot instead of the live index"
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "new_torch.json")
    args = ap.parse_args()
    wheel = args.wheel.resolve()
    manifest = json.loads(wheel.with_name(wheel.name + ".manifest.json").read_text())
    inputs = manifest["inputs"]

    work = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    clone = work / "repo"
    env = {**os.environ, "PYTHONPATH": str(clone / "src"), "CI": "1"}
    env.pop("ATTNFORGE_COMPAT", None)
    attnforge = [sys.executable, "-m", "attnforge.cli"]
    setup: list[dict[str, Any]] = []
    sh(["git", "clone", "-q", str(REPO), str(clone)], work, env, setup)
    commit = (
        args.commit
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    sh(["git", "checkout", "-q", commit], clone, env, setup)
    # the previous round: its wheel published, its compat data (no torch 2.15 rows) as the overlay
    (clone / "wheels").mkdir(exist_ok=True)
    for f in wheel.parent.glob(wheel.name + "*"):
        shutil.copy2(f, clone / "wheels" / f.name)
    published = clone / "wheels" / wheel.name
    sh([sys.executable, "-m", "tests.unit.compat_reduced", "prev-compat.toml"], clone, env, setup)
    text = (clone / "matrix.yaml").read_text()
    target = TARGET.format(
        cuda=inputs["toolkit"].removeprefix("cuda"),
        arches=", ".join(inputs["arches"]),
        profile=inputs["profile"],
    )
    (clone / "bench-matrix.yaml").write_text(text.replace("\ntargets:\n", "\ntargets:\n" + target, 1))
    head = [*attnforge, "--matrix", "bench-matrix.yaml", "--compat", "prev-compat.toml"]
    trust = ["--trusted-key", str(args.trusted_key.resolve())] if args.trusted_key else []
    sh([*head, "publish", "--to", "local", *trust, str(published)], clone, env, setup)

    pip_cache = Path.home() / ".cache" / "pip"
    cache_mb = (
        sum(f.stat().st_size for f in pip_cache.rglob("*") if f.is_file()) >> 20 if pip_cache.is_dir() else 0
    )
    steps: list[dict[str, Any]] = []
    t0 = time.monotonic()
    index = ["--snapshot", str(args.snapshot.resolve())] if args.snapshot else []
    sh([*head, "compat", "refresh", *index, "--write"], clone, env, steps)
    plan = json.loads(sh([*head, "plan", "-t", "new-torch", "--format", "json"], clone, env, steps))
    new = [c for c in plan["cells"] if c["valid"] and c["torch"] == TORCH]
    served = [
        c for c in new if c["served_by"] and c["wheel"] == wheel.name.replace("manylinux_2_34", "linux")
    ]
    to_build = [c for c in plan["cells"] if c["valid"] and not c["served_by"] and c["torch"] == TORCH]
    venv = work / "torch215"
    pip_env = {**env, "PIP_CONSTRAINT": "/dev/null"}  # the site caps torch at 2.14.1: not for this venv
    sh([args.python, "-m", "venv", str(venv)], work, env, steps)
    vpy = str(venv / "bin" / "python")
    sh([vpy, "-m", "pip", "install", "-q", "--no-compile", f"torch=={TORCH}"], work, pip_env, steps)
    sh([vpy, "-m", "pip", "install", "-q", "--no-deps", str(published)], work, pip_env, steps)
    sh([*head, "parity", "trace", str(published), "--python", vpy], clone, env, steps)
    sh([*head, "publish", "--to", "local", *trust, str(published)], clone, env, steps)
    index_url = (clone / "wheels" / "index").as_uri()
    which = sh(
        [
            *head,
            "which",
            "--index-url",
            index_url,
            "--python",
            vpy,
            "--torch",
            "2.15",
            "--profile",
            inputs["profile"],
        ],
        clone,
        env,
        steps,
    )
    total = round(time.monotonic() - t0, 1)
    proposed = wheel.name.split("-")[1] in which  # the pinned version of that same file
    coverage = json.loads((clone / "wheels" / "index" / "coverage.json").read_text())
    checked = [
        c["torch"]
        for s in coverage["sections"]
        for r in s["rows"]
        for entries in r["cells"].values()
        for e in entries
        if e.get("filename") == wheel.name
        for c in e.get("torch_checks", [])
    ]
    built = [
        m
        for m in (clone / "wheels").glob("*.manifest.json")
        if json.loads(m.read_text()).get("sha256") != manifest["sha256"]
    ]
    units = sum(int(json.loads(m.read_text())["build"].get("units_compiled", 0)) for m in built)
    torch_version = sh([vpy, "-c", "import torch; print(torch.__version__)"], work, env).strip()
    result = {
        "torch": torch_version,
        "steps": [{"command": s["command"], "wall_s": s["wall_s"]} for s in steps],
        "compiled_units": units,
        "total_s": total,
        "wheel": wheel.name,
        "wheel_built_with_torch": manifest["build"].get("torch_build") or inputs.get("torch"),
        "previous_round_build": {
            k: manifest["build"].get(k) for k in ("backend", "wall_s", "units_compiled", "cores", "started")
        },
        "pip_cache_mb_at_start": cache_mb,
        "torch_215_cells": len(new),
        "torch_215_cells_served_by_that_wheel": len(served),
        "torch_215_cells_to_build": [c["id"] for c in to_build],
        "coverage_checked_torch": checked,
        "which_proposes_that_file": proposed,
        "setup": [{"command": s["command"], "wall_s": s["wall_s"]} for s in setup],
        "index": f"snapshot {args.snapshot.name}" if args.snapshot else "https://pypi.org/simple (live)",
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, no GPU",
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    shutil.rmtree(venv, ignore_errors=True)


if __name__ == "__main__":
    main()
