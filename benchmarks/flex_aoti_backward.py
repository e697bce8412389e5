"""Probe: FlexAttention forward *and* backward as two AOTInductor packages (no Dynamo, no Inductor at load).

AOTInductor exports inference graphs; a fwd+bwd first call otherwise loads a precompiled function, whose floor
is the import of torch's compile stack (seconds). This probe builds the variant the way attnforge's builder
does (``attnforge.flex.aoti_train``: one fwd+bwd call traced with ``make_fx``, split into a forward graph
``(q, k, v) -> (out, lse)`` and a backward graph ``(q, k, v, grad_out, out, lse) -> (dq, dk, dv)``, each
exported and AOTInductor-compiled), then in a fresh process loads both through torch's C++ loader, runs
them as ``attnforge_flex`` does (``TrainPackages``, an ``autograd.Function``) and times the first fwd+bwd
call against eager gradients. A failing step is reported with its error. Use a C++ compiler that passes the
builder's probe (``CXX=/usr/bin/g++`` on the H100 machine).

    python benchmarks/flex_aoti_backward.py --device cuda --mask causal --out /tmp/aotibwd
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SHAPE = {
    "cuda": {"batch": 4, "heads_q": 16, "heads_kv": 16, "head_dim": 128, "seq_len": 2048},
    "cpu": {"batch": 1, "heads_q": 2, "heads_kv": 2, "head_dim": 64, "seq_len": 256},
}
MASKS = {"causal": {}, "sliding_window": {"window": 256}, "document": {}}


def variant(device: str, mask: str) -> dict[str, Any]:
    return {
        "name": f"{mask}-fwdbwd",
        "mask": mask,
        "window": None,
        "prefix": None,
        "score_mod": "none",
        "softcap": None,
        "dtype": "bf16",
        "dynamic": False,
        "backward": True,
        "mode": "default",
        "device": device,
        **SHAPE[device],
        **MASKS[mask],
    }


def _allow_cpu_backward() -> None:
    """CPU has no FlexAttention backward kernel; for tracing on CPU (the graph split), let eager run it."""
    import torch.nn.attention.flex_attention as fa

    fa._validate_device = lambda q, k, v: None


def build(v: dict[str, Any], dev: str, out: Path) -> dict[str, Any]:
    """attnforge's builder step (``attnforge.flex.aoti_train.build``): trace, split, export, compile."""
    from attnforge.flex import aoti_train

    try:
        return {"ok": True, **aoti_train.build(v, dev, out / f"{v['name']}{aoti_train.FORWARD_SUFFIX}")}
    except Exception as exc:  # the probe reports where the approach stops
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {str(exc)[:800]}",
            "traceback": traceback.format_exc(limit=8)[-2500:],
        }


CHILD = r"""
import faulthandler, json, sys, time
import torch
faulthandler.enable()
def say(m): print(m, file=sys.stderr, flush=True)
sys.path.insert(0, sys.argv[3])
from attnforge.flex.runtime import TrainPackages, load_package, mods
from pathlib import Path
v = json.loads(sys.argv[1]); d = sys.argv[2]; dev = v["device"]
q, k, vv = mods.make_inputs(v, dev, grad=True)
go = torch.randn_like(q)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
sync()
t0 = time.perf_counter()
attn = TrainPackages(load_package(Path(d) / (v["name"] + ".fwd.pt2")),
                     load_package(Path(d) / (v["name"] + ".bwd.pt2")))  # as attnforge_flex runs the pair
say("loaded")
load_s = time.perf_counter() - t0
o = attn(q, k, vv)
o.backward(go)
sync()
first = time.perf_counter() - t0
grads = [t.grad.clone() for t in (q, k, vv)]
times = []
for _ in range(20):
    for t in (q, k, vv): t.grad = None
    t1 = time.perf_counter(); attn(q, k, vv).backward(go); sync(); times.append(time.perf_counter() - t1)
times.sort()
# reference: eager flex_attention fwd+bwd on the same inputs
if dev == "cpu":
    import torch.nn.attention.flex_attention as fa; fa._validate_device = lambda *a: None
for t in (q, k, vv): t.grad = None
from torch.nn.attention.flex_attention import flex_attention
ref = flex_attention(q, k, vv, score_mod=mods.score_mod_for(v, dev),
    block_mask=mods.block_mask(v, dev), enable_gqa=mods.gqa(v))
ref.backward(go)
err = {n: float((a.float() - t.grad.float()).abs().max()) for n, a, t in zip("qkv", grads, (q, k, vv))}
scale = {n: float(t.grad.float().abs().max()) for n, t in zip("qkv", (q, k, vv))}
print("@@" + json.dumps({"load_s": round(load_s, 4), "first_call_s": round(first, 4),
    "steady_ms": round(times[len(times) // 2] * 1000, 4), "grad_max_err": err, "grad_max_abs": scale,
    "out_err": float((o.detach().float() - ref.detach().float()).abs().max())}))
"""


def first_call(v: dict[str, Any], out: Path) -> dict[str, Any]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(out / "ic"), "TRITON_CACHE_DIR": str(out / "tc")}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(v), str(out), str(ROOT / "src")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    for line in p.stdout.splitlines():
        if line.startswith("@@"):
            return {"ok": True, **json.loads(line[2:])}
    return {"ok": False, "rc": p.returncode, "stderr_tail": p.stderr[-2500:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--mask", default="causal", help="comma-separated: causal,sliding_window,document")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.device == "cpu":
        _allow_cpu_backward()
    results = {}
    for mask in a.mask.split(","):
        v = variant(a.device, mask)
        d = a.out / v["name"]
        d.mkdir(parents=True, exist_ok=True)
        res = build(v, a.device, d)
        if res.get("ok"):
            res["first_call"] = first_call(v, d)
        results[v["name"]] = res
        print(json.dumps({v["name"]: res})[:3000], flush=True)
        (a.out / "aoti_backward.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
