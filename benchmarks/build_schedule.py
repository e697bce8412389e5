"""How close a build's schedule came to its bound: from a wheel's manifest (or the builder's result.json),
the units' compile times (ninja's own log) against max(sum / cores, longest unit).

    python benchmarks/build_schedule.py --manifest wheels/flash_attn-...hd64128...whl.manifest.json \
        --out benchmarks/results/build_schedule_h100.json

Writes (merges) ``{"<profile>": {"profile", "units", "sum_unit_s", "longest_unit_s", "cores", "makespan_s",
"ratio", ...}}``: makespan is the span of the units in ninja's log (first start to last end), the ratio
is makespan / max(sum_unit_s / cores, longest_unit_s); 1.0 is the best any order can do.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def schedule_facts(record: dict[str, Any], cores: int | None = None) -> dict[str, Any]:
    """The schedule's numbers from a manifest (its ``build`` block) or a result.json."""
    build = record.get("build", record)
    times: dict[str, dict[str, float]] = build.get("unit_times") or {}
    if not times:
        raise SystemExit(
            "no unit_times in the record: built before attnforge recorded them, or nothing compiled"
        )
    cores = int(cores or build.get("cores") or 0)
    if cores <= 0:
        raise SystemExit("the record does not say how many cores the build had: pass --cores")
    total = sum(t["s"] for t in times.values())
    longest_unit, longest = max(((u, t["s"]) for u, t in times.items()), key=lambda x: x[1])
    span = max(t["end_s"] for t in times.values()) - min(t["start_s"] for t in times.values())
    bound = max(total / cores, longest)
    order = sorted(times, key=lambda u: times[u]["start_s"])
    inputs = record.get("inputs", {})
    return {
        "profile": inputs.get("profile") or record.get("profile"),
        "units": len(times),
        "sum_unit_s": round(total, 1),
        "longest_unit_s": round(longest, 1),
        "longest_unit": longest_unit,
        "cores": cores,
        "makespan_s": round(span, 1),
        "ratio": round(span / bound, 3),
        "bound_s": round(bound, 1),
        "max_jobs": build.get("max_jobs"),
        "nvcc_threads": build.get("nvcc_threads"),
        "compile_stage_s": build.get("compile_s"),
        "peak_unit_rss_gb": max((t.get("peak_rss_gb") or 0) for t in times.values()),
        "start_order": order,
        "unit_s": {u: times[u]["s"] for u in order},
        "cell": record.get("cell_id"),
        "toolchain": record.get("toolchain"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--manifest", type=Path, help="<wheel>.manifest.json of the build")
    src.add_argument("--result", type=Path, help="the builder's out/result.json")
    ap.add_argument("--profile", help="the profile's name (a result.json does not carry it)")
    ap.add_argument("--cores", type=int, help="cores the build had (when the record lacks it)")
    ap.add_argument("--out", type=Path, required=True, help="JSON to write or merge into")
    args = ap.parse_args()
    record = json.loads((args.manifest or args.result).read_text(encoding="utf-8"))
    if args.profile:
        record["profile"] = args.profile
    facts = schedule_facts(record, args.cores)
    facts["source"] = str(args.manifest or args.result)
    name = str(facts["profile"] or "build")
    data = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    data[name] = facts
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {
                k: facts[k]
                for k in ("profile", "units", "sum_unit_s", "longest_unit_s", "cores", "makespan_s", "ratio")
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
