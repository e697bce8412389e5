"""FlexAttention first steps through the clients people call it from: transformers, diffusers, a plain script.

Declares three clients the way users do (``flex.clients``: a transformers Llama config with length buckets,
a diffusers Flux transformer's attention with exact lengths, a plain script's causal attention), builds them
with ``attnforge flex build``'s builder into the ``attnforge-flex-kernels`` wheel, installs it into a venv
over this machine's packages, then times each client's first step in fresh processes with empty
Inductor/Triton caches (benchmarks/flex_clients_child.py): cold (the client's own compile) and warm (the
wheel: ``attnforge_flex.enable([client])``; the plain script also ``load()`` of the Mega-Cache, unchanged
code, and the ``attnforge_flex.flex_attention`` drop-in), at a declared shape, a second declared length, a
length inside a bucket (transformers) and an undeclared length.

    python benchmarks/flex_clients.py --device cuda --phase build --out-dir /tmp/fcl   # <= 9 min on the H100
    python benchmarks/flex_clients.py --device cuda --phase time  --out-dir /tmp/fcl   # <= 9 min
    python benchmarks/flex_clients.py --device cpu  --phase all   --out-dir /tmp/fcl-cpu
    python benchmarks/flex_clients.py --device cuda --phase all --clients transformers --out-dir /tmp/a  # one client
    python benchmarks/flex_clients.py --device cuda --phase merge --inputs /tmp/a/X.json /tmp/b/X.json --out-dir D

Writes ``OUT/flex_clients_<device>.json`` = ``{"device", "torch", "rows": [{"client", "variant", "shape",
"declared", "cold_first_step_s", "warm_first_step_s", "steady_step_s", "used", "max_err", ...}], ...}`` after
every row, and ``OUT/log.txt``. A failing child records an ``error`` in its row; the run goes on. The time
phase stops starting rows after ``--budget-s`` seconds (the rest are recorded as skipped). The plain
script's Mega-Cache row also records its cache keys; ``megacache_keys`` compares them with the build's
(``attnforge.flex.cachekeys``): on the H100 its fwd+bwd entries missed on load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
CHILD = ROOT / "benchmarks" / "flex_clients_child.py"

# per device: the client declarations (flex.clients), the model shapes the children build, the timed lengths
PLANS: dict[str, dict[str, Any]] = {
    "cuda": {
        "transformers": {
            "model": {"vocab": 1024, "hidden": 512, "layers": 2, "heads_q": 8, "heads_kv": 2, "batch": 2},
            "decl": {"buckets": [256, 512], "batches": [2], "training": True},
            "lengths": [
                (512, "declared"),
                (256, "second declared length"),
                (384, "inside the 512 bucket (padded)"),
                (1024, "undeclared"),
            ],
        },
        "diffusers": {
            "model": {
                "heads_q": 4,
                "head_dim": 64,
                "layers": 1,
                "single_layers": 2,
                "text_tokens": 64,
                "batch": 1,
            },
            "decl": {"seq_lens": [512, 1024], "batches": [1], "training": False},
            "lengths": [(512, "declared"), (1024, "second declared length"), (768, "undeclared")],
        },
        "torch": {
            "model": {"heads_q": 16, "heads_kv": 16, "head_dim": 128, "batch": 4},
            "decl": {"seq_lens": [1024, 2048], "batches": [4], "training": True},
            "lengths": [(1024, "declared"), (2048, "second declared length"), (1536, "undeclared")],
        },
    },
    "cpu": {
        "transformers": {
            "model": {"vocab": 256, "hidden": 128, "layers": 2, "heads_q": 4, "heads_kv": 2, "batch": 2},
            "decl": {"buckets": [64, 128], "batches": [2], "training": False},
            "lengths": [
                (128, "declared"),
                (64, "second declared length"),
                (100, "inside the 128 bucket (padded)"),
                (200, "undeclared"),
            ],
        },
        "diffusers": {
            "model": {
                "heads_q": 2,
                "head_dim": 32,
                "layers": 1,
                "single_layers": 1,
                "text_tokens": 32,
                "batch": 1,
            },
            "decl": {"seq_lens": [96, 160], "batches": [1], "training": False},
            "lengths": [(96, "declared"), (160, "second declared length"), (128, "undeclared")],
        },
        "torch": {
            "model": {"heads_q": 4, "heads_kv": 4, "head_dim": 64, "batch": 1},
            "decl": {"seq_lens": [128, 256], "batches": [1], "training": False},
            "lengths": [(128, "declared"), (256, "second declared length"), (192, "undeclared")],
        },
    },
}


CLIENTS = ("transformers", "diffusers", "torch")


def declarations(device: str, clients: tuple[str, ...] = CLIENTS) -> dict[str, Any]:
    """The ``flex.clients`` section this benchmark builds (for ``clients``)."""
    plan = PLANS[device]
    tm, dm, sm = (plan[c]["model"] for c in ("transformers", "diffusers", "torch"))
    cfg = {
        "num_attention_heads": tm["heads_q"],
        "num_key_value_heads": tm["heads_kv"],
        "hidden_size": tm["hidden"],
        "torch_dtype": "bfloat16",
    }
    decls = {
        "clients": [
            {
                "name": "llama-tiny",
                "client": "transformers",
                "config": cfg,
                "device": device,
                **plan["transformers"]["decl"],
            },
            {
                "name": "flux-tiny",
                "client": "diffusers",
                "device": device,
                "dtype": "bf16",
                "config": {"num_attention_heads": dm["heads_q"], "attention_head_dim": dm["head_dim"]},
                **plan["diffusers"]["decl"],
            },
            {
                "name": "script",
                "client": "torch",
                "device": device,
                "heads_q": sm["heads_q"],
                "heads_kv": sm["heads_kv"],
                "head_dim": sm["head_dim"],
                **plan["torch"]["decl"],
            },
        ]
    }
    return {"clients": [d for d in decls["clients"] if d["client"] in clients]}


class Log:
    """Lines to stdout and OUT/log.txt."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"[{stamp}] {line}", flush=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(f"[{stamp}] {line}\n")


def build(a: argparse.Namespace, log: Log) -> dict[str, Any]:
    """Build the declared variants and the wheel, install it into OUT/venv; writes OUT/build.json."""
    from attnforge.flex.aot_build import BuildOptions, build_and_package, failed
    from attnforge.flex.flex_spec import parse_variants
    from attnforge.parity.venv import install, make_venv

    t0 = time.perf_counter()
    variants = [
        v.as_dict() for v in parse_variants(declarations(a.device, a.clients), "benchmarks/flex_clients.py")
    ]
    log(f"build: {len(variants)} variants: {', '.join(v['name'] for v in variants)}")
    opts = BuildOptions(
        out_dir=a.out_dir / "build",
        precompile=False,
        jobs=a.jobs,
        log=log,
        cache_key_log=a.out_dir / "cachekeys",
    )
    manifest, wheel = build_and_package(variants, opts, a.out_dir / "dist")
    info: dict[str, Any] = {
        "wheel": str(wheel) if wheel else None,
        "failed": failed(manifest),
        "aoti": {
            e["name"]: (e.get("aoti") or {}).get("ok") or (e.get("aoti") or {}).get("reason")
            for e in manifest["variants"]
        },
        "env": manifest.get("env"),
        "build_s": None,
    }
    if wheel is not None:
        venv = make_venv(a.out_dir / "venv")
        install(venv, [wheel])
        info["venv_python"] = str(venv)
    info["build_s"] = round(time.perf_counter() - t0, 1)
    (a.out_dir / "build.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    log(f"build: done in {info['build_s']} s; wheel {wheel}; failed {info['failed']}")
    return info


def child(
    a: argparse.Namespace,
    python: str,
    client: str,
    mode: str,
    shape: dict[str, Any],
    extra: list[str],
    timeout: float,
) -> dict[str, Any]:
    """One first step in a fresh process with empty compile caches; its JSON, or an ``error``."""
    cache = Path(tempfile.mkdtemp(prefix=f"fcl-{client}-{mode}-", dir=a.out_dir / "caches"))
    env = dict(
        os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton")
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    cmd = [
        python,
        str(CHILD),
        "--client",
        client,
        "--mode",
        mode,
        "--shape",
        json.dumps(shape),
        "--device",
        a.device,
        "--steady",
        str(a.steady),
        *extra,
    ]
    if a.device == "cuda" and client != "diffusers":
        cmd.append("--train")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=max(30.0, timeout))
    except subprocess.TimeoutExpired:
        return {"error": f"{client} {mode}: timed out after {timeout:.0f} s"}
    lines = [
        ln
        for ln in p.stderr.splitlines()
        if "attnforge_flex" in ln and ("not served" in ln or "Warning" in ln)
    ]
    if p.returncode != 0 or not p.stdout.strip():
        return {"error": f"{client} {mode}: exit {p.returncode}: {p.stderr[-1200:]}", "log": lines}
    try:
        out = dict(json.loads(p.stdout.strip().splitlines()[-1]))
    except ValueError:
        return {"error": f"{client} {mode}: no result line: {p.stdout[-400:]}", "log": lines}
    out["log"] = lines
    return out


def _max_err(a_file: Path, b_file: Path) -> dict[str, float | None]:
    """max |a - b| of the saved output (and gradient) of two children."""
    import torch

    if not (a_file.is_file() and b_file.is_file()):
        return {"max_err": None}
    x, y = torch.load(a_file), torch.load(b_file)
    got: dict[str, float | None] = {
        "max_err": float((x["out"] - y["out"]).abs().max()),
        "out_max_abs": float(x["out"].abs().max()),
    }
    if "grad" in x and "grad" in y:
        got["grad_max_err"] = float((x["grad"] - y["grad"]).abs().max())
        got["grad_max_abs"] = float(x["grad"].abs().max())
    return got


def _row(
    client: str,
    path: str,
    shape: dict[str, Any],
    what: str,
    cold: dict[str, Any],
    warm: dict[str, Any],
    errs: dict[str, float | None],
) -> dict[str, Any]:
    declared = what != "undeclared"
    variants = ((warm.get("counters") or {}).get("stats") or {}).get("variants") or {}
    if path == "megacache" and declared:  # the script's Mega-Cache entry is the one built for this shape
        variants = {f"script-b{shape['batch']}-s{shape['seq_len']}": 1}
    row = {
        "client": client,
        "path": path,
        "variant": ",".join(sorted(variants)) or None,
        "shape": f"B{shape['batch']} S{shape['seq_len']}",
        "what": what,
        "declared": declared,
        "cold_first_step_s": cold.get("first_step_s"),
        "warm_first_step_s": warm.get("first_step_s"),
        "steady_step_s": warm.get("steady_step_s"),
        "cold_steady_step_s": cold.get("steady_step_s"),
        "used": warm.get("used"),
        **errs,
        "warm_log": warm.get("log"),
        "counters": {"cold": cold.get("counters"), "warm": warm.get("counters")},
        "errors": [r["error"] for r in (cold, warm) if "error" in r],
    }
    if row["warm_first_step_s"] is not None and row["steady_step_s"] is not None:
        row["overhead_s"] = round(row["warm_first_step_s"] - row["steady_step_s"], 4)
        row["goal_met"] = row["overhead_s"] <= 0.5 if declared else None  # the goal is for declared shapes
    return row


def time_rows(a: argparse.Namespace, log: Log) -> dict[str, Any]:
    """Time every planned row; writes the result after each."""
    import torch

    info = json.loads((a.out_dir / "build.json").read_text(encoding="utf-8"))
    venv = info.get("venv_python")
    (a.out_dir / "caches").mkdir(parents=True, exist_ok=True)
    empty = a.out_dir / "empty-artifacts"
    empty.mkdir(exist_ok=True)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": [],
        "command": "python benchmarks/flex_clients.py " + " ".join(sys.argv[1:]),
        "build": info,
        "declarations": declarations(a.device, a.clients),
        "steady_steps": a.steady,
        "timing": "first step = enable()/load() (warm) or nothing (cold) + the first step, synchronised; imports, "
        "model construction and inputs excluded; each in a fresh process with empty Inductor/Triton caches",
    }
    out_file = a.out_dir / result_name(a.device)
    res["machine_load"] = {"loadavg_start": round(os.getloadavg()[0], 2), "cores": os.cpu_count()}
    t0 = time.perf_counter()
    saves = a.out_dir / "outputs"
    saves.mkdir(exist_ok=True)
    for client, plan in PLANS[a.device].items():
        if client not in a.clients:
            continue
        for seq_len, what in plan["lengths"]:
            shape = {**plan["model"], "seq_len": seq_len}
            left = a.budget_s - (time.perf_counter() - t0)
            tag = f"{client}-s{seq_len}"
            if left <= 0 or not venv:
                why = "time budget spent" if left <= 0 else "no wheel was built"
                res["rows"].append(
                    {
                        "client": client,
                        "shape": f"B{shape['batch']} S{seq_len}",
                        "what": what,
                        "declared": what != "undeclared",
                        "errors": [f"skipped: {why}"],
                    }
                )
                log(f"{tag}: skipped ({why})")
                continue
            cold_args = ["--save", str(saves / f"{tag}-cold.pt")]
            if client == "diffusers":
                cold_args += ["--empty-artifacts", str(empty)]
            cold_py = venv if client == "diffusers" else sys.executable
            cold = child(a, cold_py, client, "cold", shape, cold_args, left)
            log(f"{tag}: cold {cold.get('first_step_s')} s {cold.get('error', '')[:300]}")
            paths = ["megacache", "dropin"] if client == "torch" else ["warm"]
            for path in paths:
                extra = ["--save", str(saves / f"{tag}-{path}.pt")]
                keys = None
                if path == "megacache" and what == "declared":
                    keys = a.out_dir / "cachekeys" / f"{tag}.load.jsonl"
                    extra += ["--cache-key-log", str(keys)]
                left = a.budget_s - (time.perf_counter() - t0)
                warm = child(a, venv, client, path, shape, extra, left)
                errs = _max_err(saves / f"{tag}-cold.pt", saves / f"{tag}-{path}.pt")
                row = _row(client, path, shape, what, cold, warm, errs)
                if keys is not None:
                    row["megacache_keys"] = _key_diff(a.out_dir / "cachekeys", keys, shape, a.device)
                res["rows"].append(row)
                log(
                    f"{tag}: {path} {warm.get('first_step_s')} s (steady {warm.get('steady_step_s')} s, used "
                    f"{warm.get('used')}, max_err {errs.get('max_err')}) {warm.get('error', '')[:300]}"
                )
                out_file.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    res["time_s"] = round(time.perf_counter() - t0, 1)
    res["machine_load"]["loadavg_end"] = round(os.getloadavg()[0], 2)
    out_file.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    log(f"time: {len(res['rows'])} rows in {res['time_s']} s -> {out_file}")
    return res


def result_name(device: str) -> str:
    return f"flex_clients_{'h100' if device == 'cuda' else 'cpu'}.json"


def merge(inputs: list[Path], out: Path) -> dict[str, Any]:
    """One result from several runs (e.g. one command per client on different machines): rows in order, a
    later run's row replacing an earlier one for the same client, path and shape; each run's command and build
    kept under ``runs``."""
    runs = [json.loads(p.read_text(encoding="utf-8")) for p in inputs]
    res = {k: runs[0][k] for k in ("device", "torch", "timing", "steady_steps") if k in runs[0]}
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for run in runs:
        for r in run["rows"]:
            rows[(r.get("client"), r.get("path"), r.get("shape"))] = r
    res["rows"] = list(rows.values())
    res["runs"] = [{k: run.get(k) for k in ("command", "build", "declarations", "time_s")} for run in runs]
    out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return res


def _key_diff(folder: Path, load: Path, shape: dict[str, Any], device: str) -> Any:
    """The plain script's Mega-Cache keys at load vs at build (the variant built for this shape)."""
    from attnforge.flex import cachekeys

    build = folder / f"script-b{shape['batch']}-s{shape['seq_len']}.build.jsonl"
    if not (build.is_file() and load.is_file()):
        return {"error": f"missing {build.name if not build.is_file() else load.name}"}
    a, b = cachekeys.read(build), cachekeys.read(load)
    return {
        "keys": [
            {k: r[k] for k in ("kind", "index", "same")} | {"differs": r["differs"][:8]}
            for r in cachekeys.diff(a, b)
        ],
        "load_log": [r["msg"][:300] for r in b if r["kind"] == "log"][:20],
    }


def bytecode(log: Log) -> None:
    """``python -m compileall`` over torch's site-packages (the H100 machine's torch has no .pyc)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    site = Path(spec.origin).parents[1] if spec and spec.origin else None
    if site is None:
        return
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", str(os.cpu_count() or 1), str(site)],
        capture_output=True,
        text=True,
    )
    log(f"compileall {site}: exit {p.returncode} in {time.perf_counter() - t0:.1f} s {p.stderr[-300:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--phase", choices=["build", "time", "all", "merge"], default="all")
    ap.add_argument(
        "--clients", default=",".join(CLIENTS), help="comma-separated subset of " + ",".join(CLIENTS)
    )
    ap.add_argument("--inputs", type=Path, nargs="*", default=[], help="merge: result files to combine")
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=3, help="variants compiled in parallel while building")
    ap.add_argument("--steady", type=int, default=10, help="steps timed after the first one")
    ap.add_argument("--budget-s", type=float, default=480.0, help="time phase: start no row after this")
    ap.add_argument("--bytecode", action="store_true", help="compileall torch's site-packages first")
    a = ap.parse_args(argv)
    a.clients = tuple(c for c in CLIENTS if c in a.clients.split(","))
    a.out_dir.mkdir(parents=True, exist_ok=True)
    if a.phase == "merge":
        merge(a.inputs, a.out_dir / result_name(a.device))
        return 0
    log = Log(a.out_dir / "log.txt")
    if a.bytecode:
        bytecode(log)
    try:
        if a.phase in ("build", "all"):
            build(a, log)
        if a.phase in ("time", "all"):
            time_rows(a, log)
    except Exception as exc:  # record and exit non-zero; partial results stay in OUT
        log(f"failed: {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
