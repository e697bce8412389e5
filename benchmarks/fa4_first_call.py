"""FlashAttention-4's first call at declared configurations: cold (FA4 compiling) against warm (the
``attnforge-fa4-kernels`` wheel installed), each in a fresh process with empty caches, and the steady state.

Every timed process has its own temp folder (FA4's default cache and the DSL's live under it): cold runs with
attnforge's hook off and an empty FA4 cache folder, warm with the hook on, so the only kernels it can find
are the wheel's. ``used`` says what the warm call ran: ``wheel`` (entries copied from the wheel, nothing
compiled) or ``compile``. Errors are FA4's output and gradients against SDPA in fp32 (upstream's tolerance
rule). ``--speed`` merges ``benchmarks/fa4_speed.py``'s output measured in the same run.

    python benchmarks/fa4_first_call.py --decls decls.json --python VENV/bin/python --speed speed.json \
        --out benchmarks/results/fa4_h100.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from attnforge.fa4 import declare
from attnforge.fa4.worker import fresh_env, run_call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decls", required=True)
    ap.add_argument(
        "--python", required=True, help="an interpreter with FA4 and the attnforge-fa4-kernels wheel"
    )
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steady", type=int, default=20)
    ap.add_argument("--speed", help="benchmarks/fa4_speed.py's JSON from the same run")
    ap.add_argument("--env", help="`python -m attnforge.fa4.worker env`'s JSON (versions, GPU)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    decls = declare.load(Path(args.decls))
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fa4-first-call-") as tmp:
        for d in decls:
            cold, warm = [], []
            for r in range(args.repeats):
                base = Path(tmp) / f"{d.name}-{r}"
                # cold: FA4 as shipped (persistent cache off), attnforge's hook off: every kernel compiles
                cold_env = fresh_env(base / "cold", None, hook=False, persistent=False)
                cold.append(run_call(args.python, d, cold_env, args.steady))
                probe = str(d.seq_lens[0] // 2 + 3)  # an undeclared length: does the same kernel serve it?
                warm.append(
                    run_call(args.python, d, fresh_env(base / "warm", None, hook=True), args.steady, probe)
                )
                for kind, res in (("cold", cold[-1]), ("warm", warm[-1])):
                    print(f"{d.name} {kind}: {res.get('error') or res['first_call_s']}", flush=True)
                    runs.append({"kind": kind, **res})
            good_c = [c for c in cold if "error" not in c]
            good_w = [w for w in warm if "error" not in w]
            if not good_c or not good_w:
                rows.append(
                    {"config": d.name, "declared": d.describe(), "error": (cold + warm)[0].get("error")}
                )
                continue
            rows.append(
                {
                    "config": d.name,
                    "declared": d.describe(),
                    "cold_first_call_s": round(statistics.median(c["first_call_s"] for c in good_c), 4),
                    "warm_first_call_s": round(statistics.median(w["first_call_s"] for w in good_w), 4),
                    "steady_call_s": round(statistics.median(w["steady_call_ms"] for w in good_w) / 1000, 6),
                    "steady_cold_compiled_call_s": round(
                        statistics.median(c["steady_call_ms"] for c in good_c) / 1000, 6
                    ),
                    "used": sorted({w["used"] for w in good_w}),
                    "max_err": max(w["max_err"] for w in good_w),
                    "grad_max_err": max((w["grad_max_err"] or 0.0) for w in good_w) if d.training else None,
                    "within_upstream_tolerance": all(w["ok"] for w in good_w + good_c),
                    "import_fa4_s": round(statistics.median(w["import_fa4_s"] for w in good_w), 3),
                    "cold_all_s": [c["first_call_s"] for c in good_c],
                    "warm_all_s": [w["first_call_s"] for w in good_w],
                    "warm_other_lens": good_w[0].get("other_lens", {}),
                }
            )
    env = json.loads(Path(args.env).read_text()) if args.env else {}
    result: dict[str, Any] = {
        "device": env.get("env", {}).get("gpu"),
        "torch": env.get("env", {}).get("torch"),
        "flash_attn_4": env.get("env", {}).get("flash_attn_4"),
        "stack": env.get("env", {}).get("pins"),
        "fingerprint": env.get("fingerprint"),
        "rows": rows,
        "speed": json.loads(Path(args.speed).read_text())["rows"] if args.speed else [],
        "speed_ratios": json.loads(Path(args.speed).read_text())["ratios"] if args.speed else {},
        "goal": "warm_first_call_s <= 0.5 at every declared configuration",
        "goal_met": all(r.get("warm_first_call_s", 1e9) <= 0.5 for r in rows),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0 if all("error" not in r for r in rows) else 6


if __name__ == "__main__":
    sys.exit(main())
