"""Merge a machine's measured unit times into the packaged seed (`src/attnforge/data/unit_times.json`), as
that machine's rows; rows of the same key and machine are replaced, other machines' rows kept. The times
come from the machine's table (`<cache>/unit_times.json`, written by every build) or from one wheel's
manifest (`build.unit_times` of a GPU build).

    python benchmarks/seed_unit_times.py --machine h100-16c-s8 --source "H100 full profile, reports/gpu/run-h100-s8" \
        --manifest reports/gpu/run-h100-s8/flash_attn-2.8.3+cu130torch2.11cxx11abiTRUE-...whl.manifest.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from attnforge.engine.unittimes import UnitTimeTable, flags_of
from attnforge.parity.profile import disabled_from_flags

SEED = Path(__file__).resolve().parents[1] / "src" / "attnforge" / "data" / "unit_times.json"


def rows_from_table(table: dict[str, Any], machine: str, source: str) -> list[dict[str, Any]]:
    """Seed rows from a measured table's ``units`` (key ``kernel/version/toolkit/unit/a<arches>/<flags>``)."""
    rows = []
    for key, row in sorted(table.get("units", {}).items()):
        kernel, version, toolkit, unit, arches, flags = key.split("/")
        rows.append(
            {
                "machine": machine,
                "kernel": kernel,
                "version": version,
                "toolkit": toolkit,
                "unit": unit,
                "arches": int(arches[1:]),
                "flags": flags,
                "s": row["s"],
                "peak_rss_gb": row.get("peak_rss_gb"),
                "source": f"{source} (runs {row.get('runs')})",
            }
        )
    return rows


def table_from_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """A measured table (``units`` by key) from one build's manifest, recorded the way a build records its own
    (`UnitTimeTable.record`: same key, ccache hits left out)."""
    inputs, times = manifest["inputs"], manifest["build"].get("unit_times") or {}
    if not times:
        raise SystemExit("the manifest has no build.unit_times: nothing was compiled, or it predates them")
    flags = flags_of(disabled_from_flags(list(inputs.get("profile_flags") or [])))
    with tempfile.TemporaryDirectory() as tmp:
        table = UnitTimeTable(Path(tmp) / "unit_times.json")
        table.record(
            manifest["kernel"],
            manifest["kernel_version"],
            inputs["toolkit"],
            len(inputs["arches"]),
            flags,
            times,
            "manifest",
        )
        return {"units": table.measured}


def write_seed(seed: dict[str, Any], path: Path) -> None:
    """One row per line, like the packaged file."""
    head = [f" {json.dumps(k)}: {json.dumps(seed[k])}," for k in seed if k != "units"]
    units = ",\n".join("  " + json.dumps(r) for r in seed["units"])
    path.write_text("{\n" + "\n".join(head) + '\n "units": [\n' + units + "\n ]\n}\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--table", type=Path, help="a machine's unit_times.json")
    src.add_argument("--manifest", type=Path, help="a wheel's manifest (its build.unit_times)")
    ap.add_argument("--machine", required=True, help="the machine's name in the seed (h100-16c, dev-2c)")
    ap.add_argument("--source", required=True, help="what was built, where and when")
    ap.add_argument("--seed", type=Path, default=SEED)
    args = ap.parse_args()
    seed = json.loads(args.seed.read_text(encoding="utf-8"))
    if args.machine not in seed.get("machines", {}):
        raise SystemExit(f"--machine {args.machine!r}: describe it in the seed's machines first")
    if args.manifest:
        table = table_from_manifest(json.loads(args.manifest.read_text(encoding="utf-8")))
    else:
        table = json.loads(args.table.read_text(encoding="utf-8"))
    new = rows_from_table(table, args.machine, args.source)
    keys = {
        (r["machine"], r["kernel"], r["version"], r["toolkit"], r["unit"], r["arches"], r["flags"])
        for r in new
    }
    kept = [
        r
        for r in seed["units"]
        if (r["machine"], r["kernel"], r["version"], r["toolkit"], r["unit"], r["arches"], r["flags"])
        not in keys
    ]
    seed["units"] = kept + new
    write_seed(seed, args.seed)
    print(f"{len(new)} row(s) for {args.machine} in {args.seed} ({len(seed['units'])} in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
