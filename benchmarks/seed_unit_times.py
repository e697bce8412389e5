"""Merge a machine's measured unit times (`<cache>/unit_times.json`, written by every build) into the packaged
seed (`src/attnforge/data/unit_times.json`), as that machine's rows; rows of the same key and machine are
replaced, other machines' rows kept.

    python benchmarks/seed_unit_times.py --table /tmp/i18/unit_times-after-full.json --machine h100-16c \
        --source "H100 full profile, MAX_JOBS=16, 2026-11-24 (benchmarks/h100_issue18.sh hold-b)"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SEED = Path(__file__).resolve().parents[1] / "src" / "attnforge" / "data" / "unit_times.json"


def rows_from_table(table: dict[str, Any], machine: str, source: str) -> list[dict[str, Any]]:
    """Seed rows from a measured table's ``units`` (key ``kernel/version/toolkit/unit/a<arches>/<flags>``)."""
    rows = []
    for key, row in sorted(table.get("units", {}).items()):
        kernel, version, toolkit, unit, arches, flags = key.split("/")
        rows.append({"machine": machine, "kernel": kernel, "version": version, "toolkit": toolkit, "unit": unit,
                     "arches": int(arches[1:]), "flags": flags, "s": row["s"],
                     "peak_rss_gb": row.get("peak_rss_gb"), "source": f"{source} (runs {row.get('runs')})"})  # fmt: skip
    return rows


def write_seed(seed: dict[str, Any], path: Path) -> None:
    """One row per line, like the packaged file."""
    head = [f" {json.dumps(k)}: {json.dumps(seed[k])}," for k in seed if k != "units"]
    units = ",\n".join("  " + json.dumps(r) for r in seed["units"])
    path.write_text("{\n" + "\n".join(head) + '\n "units": [\n' + units + "\n ]\n}\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True, help="a machine's unit_times.json")
    ap.add_argument("--machine", required=True, help="the machine's name in the seed (h100-16c, dev-2c)")
    ap.add_argument("--source", required=True, help="what was built, where and when")
    ap.add_argument("--seed", type=Path, default=SEED)
    args = ap.parse_args()
    seed = json.loads(args.seed.read_text(encoding="utf-8"))
    new = rows_from_table(json.loads(args.table.read_text(encoding="utf-8")), args.machine, args.source)
    keys = {
        (r["machine"], r["kernel"], r["version"], r["toolkit"], r["unit"], r["arches"], r["flags"])
        for r in new
    }
    kept = [r for r in seed["units"]
            if (r["machine"], r["kernel"], r["version"], r["toolkit"], r["unit"], r["arches"], r["flags"]) not in keys]  # fmt: skip
    seed["units"] = kept + new
    write_seed(seed, args.seed)
    print(f"{len(new)} row(s) for {args.machine} in {args.seed} ({len(seed['units'])} in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
