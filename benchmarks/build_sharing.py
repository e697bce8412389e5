"""Cost of a CUDA lane and of extra Pythons once kernels are shared: real builds, timed end to end.

Three phases, each a real `attnforge build` (local backend, cold kernel objects, ccache off):
- ``one``: one cell (the lane's first torch and first Python);
- ``lane``: every (torch, Python) of one CUDA lane (default torch 2.12, 2.13, 2.14 x Python 3.11, 3.12);
- ``four``: one torch for four Pythons (default torch 2.14 x 3.10-3.13).
The torch venvs and their host-compiler probes are made first (not timed: cached in real use).
Results merge into ``--out`` (benchmarks/results/matrix_cost.json): one_cell_s, lane_s, lane, lane_ratio,
four_python_s, ratio, with each cell's wall time and what it compiled.

    python benchmarks/build_sharing.py --work /tmp/bs --phases one,lane,four --profile hd128 --arch sm_90

This machine: ``--pip-isolated`` keeps pip off the local find-links folder whose torch 2.13.0+cpu wheel
would win over PyPI's CUDA build.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attnforge.builder.compiler import choose_host_compiler  # noqa: E402
from attnforge.builder.report import Reporter  # noqa: E402
from attnforge.builder.spec import BuildSpec, Source  # noqa: E402
from attnforge.builder.torchenv import ensure_venv  # noqa: E402
from attnforge.matrix.file import load_matrix  # noqa: E402

SDIST = "flash_attn-2.8.3.tar.gz"
LANE_GOAL = 1.3  # a lane of 3 torch x 2 Pythons against one of its cells
FOUR_GOAL = 1.15  # four Pythons of one torch against one cell


def matrix_text(args: argparse.Namespace, cache: Path) -> str:
    """A matrix with the repository's kernel and profiles and three targets: one, lane, four."""
    main = load_matrix(ROOT / "matrix.yaml")
    kernel = main.kernels["flash-attn"]
    profile = main.profiles[args.profile].model_dump(exclude_none=True, exclude_defaults=True)
    lane_t, lane_p = args.lane_torch.split(","), args.lane_python.split(",")
    four_t, four_p = args.four_torch, args.four_python.split(",")

    def target(torch: list[str], python: list[str]) -> dict[str, Any]:
        axes = {"toolkit": [args.toolkit], "torch": torch, "python": python, "arch": [args.arch]}
        return {"matrix": {**axes, "profile": [args.profile]}}

    source = {"kind": "pypi-sdist", "sha256": kernel.source.sha256}
    targets = {
        "one": target(lane_t[-1:], lane_p[:1]),
        "lane": target(lane_t, lane_p),
        "four": target([four_t], four_p),
    }
    doc = {
        "version": 1,
        "kernels": {"flash-attn": {"version": kernel.version, "source": source}},
        "profiles": {args.profile: profile},
        "defaults": {
            "kernel": "flash-attn",
            "cxx11_abi": True,
            "platform": "x86_64",
            "profile": args.profile,
        },
        "targets": targets,
        "build": {"backend": "local", "cache_dir": str(cache), "output_dir": "wheels"},
    }
    return json.dumps(doc, indent=1)  # JSON is YAML


def plan_cells(work: Path, targets: list[str]) -> list[dict[str, Any]]:
    """The valid cells of these targets (`attnforge plan --format json`)."""
    cells: list[dict[str, Any]] = []
    for target in targets:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "attnforge.cli",
                "--matrix",
                str(work / "matrix.yaml"),
                "plan",
                "-t",
                target,
                "--format",
                "json",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        cells += [c for c in json.loads(out)["cells"] if c["valid"]]
    return cells


def make_venvs(work: Path, cache: Path, targets: list[str]) -> None:
    """The (Python, torch) venvs the phases need, made the way the builder makes them (not timed)."""
    seen = set()
    for cell in plan_cells(work, targets):
        cp = "cp" + cell["python"].replace(".", "")
        name = f"{cp}-torch{cell['torch']}-{cell['torch_variant']}"
        if name in seen:
            continue
        seen.add(name)
        spec = BuildSpec(
            cell_id="venv",
            kernel="flash-attn",
            kernel_version="2.8.3",
            source=Source("/", "0"),
            python=cell["python"],
            torch=cell["torch"],
            torch_variant=cell["torch_variant"],
            build_dir=str(work / "x"),
            output_dir=str(work / "x"),
            venv_dir=str(cache / "venvs" / name),
        )
        info = ensure_venv(spec, Reporter(None), dict(os.environ))
        # the host-compiler probe is cached in the venv too: warm, like a venv used before
        choose_host_compiler(info["vpy"], Path(spec.venv_dir), dict(os.environ), Reporter(None))
        print(f"venv ready: {name} (torch {info['torch']}, CUDA {info['cuda']})", flush=True)


def timed_build(work: Path, cache: Path, target: str) -> dict[str, Any]:
    """`attnforge build -t target` from cold kernel objects; wall time and each cell's manifest facts."""
    shutil.rmtree(cache / "cells", ignore_errors=True)
    shutil.rmtree(work / "wheels", ignore_errors=True)
    env = {**os.environ, "CCACHE_DISABLE": "1", "CI": "1"}
    log = work / f"build-{target}.log"
    start = time.monotonic()
    with log.open("w") as fh:
        rc = subprocess.run(
            [
                sys.executable,
                "-m",
                "attnforge.cli",
                "--matrix",
                str(work / "matrix.yaml"),
                "build",
                "-t",
                target,
                "--quiet",
                "--force",
            ],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        ).returncode
    wall = time.monotonic() - start
    if rc != 0:
        raise SystemExit(f"build -t {target} failed ({rc}); log: {log}")
    cells = []
    for m in sorted((work / "wheels").glob("*.manifest.json")):
        data = json.loads(m.read_text())
        b = data["build"]
        cells.append(
            {
                "cell": data["cell_id"],
                "wall_s": b["wall_s"],
                "units_compiled": b["units_compiled"],
                "units_reused": b["units_reused"],
                "max_jobs": b["max_jobs"],
            }
        )
    return {"wall_s": round(wall, 1), "cells": cells, "log": str(log)}


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def summarise(results: dict[str, Any], args: argparse.Namespace) -> None:
    """The ratios of the phases run so far, with the conditions, written to ``args.out``."""
    runs = results.get("sharing_runs", {})
    one = runs.get("one", {}).get("wall_s")
    if one and "lane" in runs:
        lane_s = runs["lane"]["wall_s"]
        lane = f"{args.toolkit} x torch {args.lane_torch} x Python {args.lane_python}"
        results.update(one_cell_s=one, lane_s=lane_s, lane_ratio=round(lane_s / one, 3), lane=lane)
    if one and "four" in runs:
        results.update(four_python_s=runs["four"]["wall_s"], ratio=round(runs["four"]["wall_s"] / one, 3))
    if "lane_ratio" in results and "ratio" in results:
        results["goals"] = {"lane_ratio": f"<= {LANE_GOAL}", "ratio": f"<= {FOUR_GOAL}"}
        results["goals_met"] = results["lane_ratio"] <= LANE_GOAL and results["ratio"] <= FOUR_GOAL
    results["sharing_conditions"] = {
        "profile": args.profile,
        "arch": args.arch,
        "toolkit": args.toolkit,
        "machine": f"{os.cpu_count()} cores; load averages per phase in sharing_runs",
        "what": "attnforge build --backend local from cold kernel objects, ccache off, torch venvs made before; "
        "each phase's command in sharing_runs",
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="working folder (matrix, wheels, logs)")
    ap.add_argument("--cache", type=Path, help="attnforge cache (venvs, sources) [WORK/cache]")
    ap.add_argument("--phases", default="one,lane,four")
    ap.add_argument("--profile", default="hd128")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--toolkit", default="cuda13.0")
    ap.add_argument("--lane-torch", default="2.12,2.13,2.14", help="torch releases of the lane (last: 'one')")
    ap.add_argument("--lane-python", default="3.11,3.12")
    ap.add_argument("--four-torch", default="2.14")
    ap.add_argument("--four-python", default="3.10,3.11,3.12,3.13")
    ap.add_argument("--sdist", type=Path, help=f"a local {SDIST} to put in the cache (no download)")
    ap.add_argument("--pip-isolated", action="store_true", help="pip without this machine's config files")
    ap.add_argument(
        "--keep-objects", type=Path, help="copy each phase's kernel objects to DIR/<phase>/<key>/"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "matrix_cost.json")
    args = ap.parse_args()
    work = args.work.resolve()
    cache = (args.cache or work / "cache").resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / "matrix.yaml").write_text(matrix_text(args, cache))
    if args.sdist:
        (cache / "sources").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.sdist, cache / "sources" / SDIST)
    if args.pip_isolated:
        os.environ.pop("PIP_FIND_LINKS", None)
        os.environ["PIP_CONFIG_FILE"] = os.devnull
    phases = [p for p in args.phases.split(",") if p]
    make_venvs(work, cache, phases)
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    runs = results.setdefault("sharing_runs", {})
    command = "python benchmarks/build_sharing.py " + " ".join(sys.argv[1:])  # kept with each phase it ran
    for phase in phases:
        before = load_avg()
        print(f"{phase}: building (load {before})", flush=True)
        res = timed_build(work, cache, phase)
        res.update(
            load_before=before,
            load_after=load_avg(),
            date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            command=command,
        )
        runs[phase] = res
        print(f"{phase}: {res['wall_s']} s", flush=True)
        summarise(results, args)
        if args.keep_objects:  # e.g. the kernel objects the GPU machine links into its own torch's binding
            for objects in (cache / "cells").glob("*/objects"):
                dest = args.keep_objects / phase / objects.parent.name / "objects"
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(objects, dest)
    print(
        json.dumps(
            {k: results.get(k) for k in ("one_cell_s", "lane_s", "lane_ratio", "four_python_s", "ratio")}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
