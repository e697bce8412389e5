"""First FlexAttention call in a fresh process with an empty compile cache: cold vs Mega-Cache vs precompiled
function vs AOTInductor.

For three mask families (causal, sliding window, document) and two modes (fwd, fwd+bwd; CPU: fwd only, as
FlexAttention has no CPU backward) the variants are built with attnforge's Flex builder, then each first call
is timed in its own process with fresh Inductor/Triton cache dirs: cold (nothing loaded), after
``torch.compiler.load_cache_artifacts()`` of the Mega-Cache artifact (load time included), after loading the
precompiled function (``torch.compile(...).aot_compile``, fwd and bwd; load included), and through
the AOTInductor package(s) as ``attnforge_flex`` loads them (fwd+bwd: the forward and backward packages of
``attnforge.flex.aoti_train``; null where they did not build or crashed). Every time includes
building the block mask. Writes ``{"device", "torch", "rows": [{"mask", "mode", "cold_s", "megacache_s",
"aoti_s", "precompiled_s", "detail"}], "best_speedup"}`` (best_speedup: cold / best cached over the fwd+bwd
rows; on CPU over the fwd rows; ``detail``: load and block-mask seconds of each timed call).

    python benchmarks/flex_first_call.py --device cuda --out benchmarks/results/flex_first_call.json
    python benchmarks/flex_first_call.py --device cpu --out benchmarks/results/flex_first_call_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attnforge.flex.aot_build import BuildOptions, build_variants, precompile_variant, run_worker  # noqa: E402

MASKS = {
    "causal": {"mask": "causal"},
    "sliding_window": {"mask": "sliding_window", "window": 256},
    "document": {"mask": "document"},
}
SHAPE = {
    "cuda": {"batch": 4, "heads_q": 16, "heads_kv": 16, "head_dim": 128, "seq_len": 2048},
    "cpu": {"batch": 1, "heads_q": 4, "heads_kv": 4, "head_dim": 64, "seq_len": 256},
}


def variants(device: str, masks: list[str]) -> list[dict[str, Any]]:
    out = []
    modes = ("fwd", "fwd+bwd") if device == "cuda" else ("fwd",)
    for m in masks:
        for mode in modes:
            out.append(
                {
                    "name": f"{m}-{mode.replace('+', '')}",
                    "window": None,
                    "prefix": None,
                    "score_mod": "none",
                    "softcap": None,
                    "dtype": "bf16",
                    "dynamic": False,
                    "backward": mode == "fwd+bwd",
                    "mode": "default",
                    "device": device,
                    **SHAPE[device],
                    **MASKS[m],
                }
            )
    return out


def first_call(
    python: str,
    v: dict[str, Any],
    mode: str,
    artifact: Path | None,
    work: Path,
    steady: int = 0,
    profile: Path | None = None,
) -> dict[str, Any]:
    args = (
        ["--mode", mode, "--steady", str(steady)]
        + (["--profile", str(profile)] if profile else [])
        + (["--artifact", str(artifact)] if artifact else [])
        + (["--backward"] if v["backward"] else [])
    )
    cache = Path(tempfile.mkdtemp(prefix=f"fc-{v['name']}-{mode}-", dir=work))
    return run_worker(python, "first-call", v, args, cache, 900)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=None, help="keep the built artifacts here")
    ap.add_argument("--masks", default=",".join(MASKS))
    ap.add_argument("--jobs", type=int, default=3, help="variants built in parallel")
    ap.add_argument("--no-aoti", action="store_true")
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--build-only", action="store_true", help="build the artifacts into --work, time nothing")
    ap.add_argument(
        "--reuse", action="store_true", help="time the artifacts a --build-only run left in --work"
    )
    ap.add_argument(
        "--precompile-again",
        action="store_true",
        help="with --reuse: redo only the precompiled functions in --work, time nothing",
    )
    ap.add_argument(
        "--compile-threads",
        type=int,
        default=None,
        help="TORCHINDUCTOR_COMPILE_THREADS for the timed processes (1: no compile worker pool)",
    )
    ap.add_argument(
        "--steady",
        type=int,
        default=20,
        help="after the first call, time this many more in the same process (median: steady_ms)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --reuse: profile (cProfile) the first call of the first variant of the last "
        "mode in each path, one text file per path in DIR; times nothing else",
    )
    a = ap.parse_args(argv)
    if a.compile_threads is not None:
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(a.compile_threads)
    work = a.work or Path(tempfile.mkdtemp(prefix="flex-first-call-"))
    work.mkdir(parents=True, exist_ok=True)
    vs = variants(a.device, [m for m in a.masks.split(",") if m])
    pre = not a.no_precompile
    if a.reuse:
        entries = json.loads((work / "build-manifests.json").read_text(encoding="utf-8"))
        if a.precompile_again:
            opts = BuildOptions(out_dir=work, jobs=1, aoti_probe=False)
            for v in vs:
                art = work / ("build-bwd" if v["backward"] else "build") / "artifacts"
                entries[v["name"]]["precompiled"] = precompile_variant(v, art, work / "pre-again", opts)
            (work / "build-manifests.json").write_text(
                json.dumps(entries, indent=1, default=str), encoding="utf-8"
            )
            return 0
        if a.profile:
            return profile_paths(vs[-1], entries[vs[-1]["name"]], work, a.profile)
    else:
        opts = BuildOptions(
            out_dir=work / "build", aoti=not a.no_aoti, precompile=pre, jobs=a.jobs, aoti_probe=False
        )
        # fwd and fwd+bwd variants apart (fwd+bwd AOTInductor: a forward and a backward package; GPU only)
        fwd = [v for v in vs if not v["backward"]]
        bwd = [v for v in vs if v["backward"]]
        man = build_variants(fwd, opts)
        entries = {e["name"]: e for e in man["variants"]}
        if bwd:
            opts_b = BuildOptions(
                out_dir=work / "build-bwd",
                aoti=not a.no_aoti and a.device == "cuda",
                precompile=pre,
                jobs=a.jobs,
                aoti_probe=False,
            )
            entries |= {e["name"]: e for e in build_variants(bwd, opts_b)["variants"]}
        (work / "build-manifests.json").write_text(
            json.dumps(entries, indent=1, default=str), encoding="utf-8"
        )
        if a.build_only:
            print(f"built into {work}")
            return 0
    import torch

    device = torch.cuda.get_device_name() if a.device == "cuda" else f"cpu ({_cpu()})"
    art = {v["name"]: artifact_dir(work, v) for v in vs}
    rows = []
    load0 = os.getloadavg()[0]
    for v in vs:
        e = entries[v["name"]]
        mode = "fwd+bwd" if v["backward"] else "fwd"
        n = a.steady
        cold = first_call(sys.executable, v, "cold", None, work, n)
        mc = e.get("megacache") or {}
        mega = first_call(sys.executable, v, "megacache", art[v["name"]] / mc["file"], work, n) if mc else {}
        pc = e.get("precompiled") or {}
        prec = (
            first_call(sys.executable, v, "precompiled", art[v["name"]] / pc["file"], work, n)
            if pc.get("ok")
            else {}
        )
        ao = e.get("aoti") or {}
        aoti = (
            first_call(sys.executable, v, "aoti", art[v["name"]] / ao["file"], work, n)
            if ao.get("ok")
            else {}
        )
        timed = {"cold": cold, "megacache": mega, "precompiled": prec, "aoti": aoti}
        row = {
            "mask": v["mask"],
            "mode": mode,
            "cold_s": _s(cold),
            "megacache_s": _s(mega),
            "aoti_s": _s(aoti),
            "precompiled_s": _s(prec),
            "detail": {
                k: {"load_s": r.get("load_s"), "blockmask_s": r.get("blockmask_s")}
                for k, r in timed.items()
                if r and r.get("ok")
            },
            # median ms of the calls after the first, and each loaded path's speed relative to cold-compiled
            "steady_ms": {k: r.get("steady_ms") for k, r in timed.items() if r and r.get("ok")},
            "steady_vs_cold": steady_ratios(timed),
        }
        rows.append(row)
        notes = {
            "megacache_hits": (mega.get("counters") or {}),
            "aoti": ao.get("reason") or "ok",
            "precompiled": pc.get("reason") or "ok",
            "errors": [f"{k}: {r.get('error')}" for k, r in timed.items() if r and not r.get("ok")],
        }
        print(json.dumps(row), json.dumps(notes)[:600], flush=True)
        res = write(a.out, device, torch.__version__, rows, a.device, load0)  # partial results survive
    res = write(a.out, device, torch.__version__, rows, a.device, load0)
    print(json.dumps(res, indent=1))
    return 0


def artifact_dir(work: Path, v: dict[str, Any]) -> Path:
    return work / ("build-bwd" if v["backward"] else "build") / "artifacts"


def profile_paths(v: dict[str, Any], entry: dict[str, Any], work: Path, out: Path) -> int:
    """One profiled first call per path (cold, Mega-Cache, precompiled, AOTInductor) of the variant ``v``:
    where a cached first call spends its time (``<variant>-<path>.txt`` in ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    for mode, key in (
        ("cold", None),
        ("megacache", "megacache"),
        ("precompiled", "precompiled"),
        ("aoti", "aoti"),
    ):
        art = (entry.get(key) or {}) if key else {}
        if key and not (art.get("file") and art.get("ok", True)):
            continue
        path = artifact_dir(work, v) / art["file"] if key else None
        res = first_call(sys.executable, v, mode, path, work, 0, out / f"{v['name']}-{mode}.txt")
        print(mode, json.dumps({k: res.get(k) for k in ("ok", "seconds", "load_s", "error")}), flush=True)
    return 0


def steady_ratios(timed: dict[str, dict[str, Any]]) -> dict[str, float]:
    """cold-compiled steady ms / each loaded path's (1.0 = as fast; the goal is within 2%)."""
    base = (timed.get("cold") or {}).get("steady_ms")
    return {
        k: round(base / r["steady_ms"], 3)
        for k, r in timed.items()
        if k != "cold" and base and r and r.get("ok") and r.get("steady_ms")
    }


def best_speedup(rows: list[dict[str, Any]], device: str) -> float | None:
    """cold / best cached over the fwd+bwd rows (CPU: the fwd rows)."""
    best = None
    for r in rows:
        if r["mode"] != ("fwd+bwd" if device == "cuda" else "fwd"):
            continue
        cached = [x for x in (r["megacache_s"], r["aoti_s"], r.get("precompiled_s")) if x]
        if r["cold_s"] and cached:
            sp = r["cold_s"] / min(cached)
            best = sp if best is None or sp > best else best
    return round(best, 2) if best else None


def write(
    out: Path, device_name: str, torch_version: str, rows: list[dict[str, Any]], device: str, load0: float
) -> dict[str, Any]:
    res = {
        "device": device_name,
        "torch": torch_version,
        "rows": rows,
        "best_speedup": best_speedup(rows, device),
        "command": "python benchmarks/flex_first_call.py " + " ".join(sys.argv[1:]),
        # 1-min load average when timing began and now, against the core count: an idle machine or not
        "machine_load": {
            "loadavg_start": round(load0, 2),
            "loadavg_end": round(os.getloadavg()[0], 2),
            "cores": os.cpu_count(),
            "compile_threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "default"),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return res


def _s(r: dict[str, Any]) -> float | None:
    return round(float(r["seconds"]), 3) if r and r.get("ok") else None


def _cpu() -> str:
    import torch

    from attnforge.flex.runtime.envkeys import _cpu_name

    return f"{_cpu_name()}, {torch.backends.cpu.get_cpu_capability()}"


if __name__ == "__main__":
    sys.exit(main())
