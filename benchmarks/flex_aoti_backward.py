"""Probe: FlexAttention forward *and* backward as two AOTInductor packages (no Dynamo, no Inductor at load).

AOTInductor exports inference graphs, so attnforge's packages are forward only and a fwd+bwd first call loads a
precompiled function, whose floor is the import of torch's compile stack (seconds). This probe tries the
other way: trace one fwd+bwd step with ``make_fx`` (the graph then holds the ``flex_attention`` and
``flex_attention_backward`` higher-order ops), split it into a forward graph ``(q, k, v) -> (out, lse)`` and a
backward graph ``(q, k, v, out, lse, grad_out) -> (dq, dk, dv)``, export and AOTInductor-compile each, then in
a fresh process load both through torch's C++ loader, run them inside an ``autograd.Function`` and time the
first fwd+bwd call against eager gradients. Each step's outcome is reported; a failing step says where the
approach stops.

    python benchmarks/flex_aoti_backward.py --device cuda --mask causal --out /tmp/aotibwd
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
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
    return {"name": f"{mask}-fwdbwd", "mask": mask, "window": None, "prefix": None, "score_mod": "none",
            "softcap": None, "dtype": "bf16", "dynamic": False, "backward": True, "mode": "default",
            "device": device, **SHAPE[device], **MASKS[mask]}  # fmt: skip


def _allow_cpu_backward() -> None:
    """CPU has no FlexAttention backward kernel; for tracing on CPU (the graph split), let eager run it."""
    import torch.nn.attention.flex_attention as fa

    fa._validate_device = lambda q, k, v: None


def trace_and_split(v: dict[str, Any], dev: str) -> tuple[Any, Any, dict[str, Any]]:
    """make_fx of one fwd+bwd step, split into the forward and backward graphs."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.attention.flex_attention import flex_attention as flex

    from attnforge.flex.runtime import mods

    bm = mods.block_mask(v, dev)
    sm = mods.score_mod_for(v, dev)
    gqa = mods.gqa(v)

    def step(q: Any, k: Any, vv: Any, go: Any) -> Any:
        q, k, vv = (t.detach().requires_grad_(True) for t in (q, k, vv))
        out = flex(q, k, vv, score_mod=sm, block_mask=bm, enable_gqa=gqa)
        dq, dk, dv = torch.autograd.grad(out, (q, k, vv), go)
        return out, dq, dk, dv

    q, k, vv = mods.make_inputs(v, dev)
    go = torch.randn_like(q)
    with torch.enable_grad():
        gm = make_fx(step, tracing_mode="fake", _allow_non_fake_inputs=True)(q, k, vv, go)
    hops = [n for n in gm.graph.nodes if n.op == "call_function" and "flex_attention" in str(n.target)]
    info = {"hops": [str(n.target) for n in hops], "nodes": len(gm.graph.nodes)}
    fwd_hop = next(n for n in hops if str(n.target).endswith("flex_attention"))
    outs = {u.args[1]: u for u in fwd_hop.users if u.op == "call_function"}  # getitem index -> node
    return _forward_graph(gm, outs), _backward_graph(gm, fwd_hop, outs), info


def _forward_graph(gm: Any, outs: dict[int, Any]) -> Any:
    """(q, k, v) -> (out, lse)."""
    import copy

    import torch

    g = copy.deepcopy(gm)
    names = {outs[0].name, outs[1].name}
    keep = [n for n in g.graph.nodes if n.name in names]
    keep.sort(key=lambda n: n.name != outs[0].name)
    output = next(n for n in g.graph.nodes if n.op == "output")
    output.args = (tuple(keep),)
    g.graph.eliminate_dead_code()
    for ph in [n for n in g.graph.nodes if n.op == "placeholder" and not n.users]:
        g.graph.erase_node(ph)  # go: an unused input would not be an input of the compiled model
    g.recompile()
    return torch.fx.GraphModule(g, g.graph)


def _backward_graph(gm: Any, fwd_hop: Any, outs: dict[int, Any]) -> Any:
    """(q, k, v, go, out, lse) -> (dq, dk, dv): the forward op's results become inputs."""
    import copy

    import torch

    g = copy.deepcopy(gm)
    by_name = {n.name: n for n in g.graph.nodes}
    last_ph = [n for n in g.graph.nodes if n.op == "placeholder"][-1]
    output = next(n for n in g.graph.nodes if n.op == "output")
    output.args = (tuple(output.args[0][1:]),)  # drop out from the results
    with g.graph.inserting_after(last_ph):
        lse_in = g.graph.placeholder("lse_in")
    with g.graph.inserting_after(last_ph):
        out_in = g.graph.placeholder("out_in")
    for idx, ph in ((0, out_in), (1, lse_in)):
        old = by_name[outs[idx].name]
        old.replace_all_uses_with(ph)
    g.graph.eliminate_dead_code()
    if any(n.op == "call_function" and str(n.target).endswith(".flex_attention") for n in g.graph.nodes):
        raise RuntimeError("the forward op is still needed by the backward graph (max_scores?)")
    g.recompile()
    return torch.fx.GraphModule(g, g.graph)


def build(v: dict[str, Any], dev: str, out: Path) -> dict[str, Any]:
    import torch

    from attnforge.flex.runtime import mods

    res: dict[str, Any] = {}
    t0 = time.perf_counter()
    fwd, bwd, info = trace_and_split(v, dev)
    res["trace"] = {**info, "s": round(time.perf_counter() - t0, 2)}
    (out / "fwd_graph.txt").write_text(fwd.code, encoding="utf-8")
    (out / "bwd_graph.txt").write_text(bwd.code, encoding="utf-8")
    q, k, vv = mods.make_inputs(v, dev)
    go = torch.randn_like(q)
    with torch.no_grad():
        o, lse = fwd(q, k, vv)
    for name, gmod, args in (("fwd", fwd, (q, k, vv)), ("bwd", bwd, (q, k, vv, go, o, lse))):
        t0 = time.perf_counter()
        try:
            ep = torch.export.export(gmod, args, strict=False)
            path = torch._inductor.aoti_compile_and_package(ep, package_path=str(out / f"{name}.pt2"))
            res[name] = {"ok": True, "s": round(time.perf_counter() - t0, 2), "path": str(path)}
        except Exception as exc:  # the probe reports where the approach stops
            res[name] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:800]}",
                         "traceback": traceback.format_exc(limit=8)[-2500:]}  # fmt: skip
            break
    return res


CHILD = r"""
import faulthandler, json, sys, time
import torch
faulthandler.enable()
def say(m): print(m, file=sys.stderr, flush=True)
sys.path.insert(0, sys.argv[3])
from attnforge.flex.runtime import load_package, mods
from pathlib import Path
v = json.loads(sys.argv[1]); d = sys.argv[2]; dev = v["device"]
q, k, vv = mods.make_inputs(v, dev, grad=True)
go = torch.randn_like(q)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
sync()
t0 = time.perf_counter()
import os
if os.environ.get("PROBE_LOADER") == "python":
    from torch._inductor import config as ic
    ic.cpp.vec_isa_ok = True
    fwd = torch._inductor.aoti_load_package(d + "/fwd.pt2")
    bwd = torch._inductor.aoti_load_package(d + "/bwd.pt2")
else:
    fwd = load_package(Path(d) / "fwd.pt2")
    bwd = load_package(Path(d) / "bwd.pt2")
say(f"loaded {type(fwd).__name__} {type(bwd).__name__}")
load_s = time.perf_counter() - t0

class Attn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, vv):
        say("fwd")
        out, lse = fwd(q, k, vv)
        say("fwd done")
        ctx.save_for_backward(q, k, vv, out, lse)
        return out
    @staticmethod
    def backward(ctx, g):
        q, k, vv, out, lse = ctx.saved_tensors
        say("bwd")
        return tuple(bwd(q, k, vv, g.contiguous(), out, lse))

o = Attn.apply(q, k, vv)
o.backward(go)
sync()
first = time.perf_counter() - t0
grads = [t.grad.clone() for t in (q, k, vv)]
times = []
for _ in range(20):
    for t in (q, k, vv): t.grad = None
    t1 = time.perf_counter(); Attn.apply(q, k, vv).backward(go); sync(); times.append(time.perf_counter() - t1)
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
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(v), str(out), str(ROOT / "src")],
                       capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
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
        try:
            res = build(v, a.device, d)
        except Exception as exc:
            res = {"trace": {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:800]}",
                             "traceback": traceback.format_exc(limit=8)[-2500:]}}  # fmt: skip
        if res.get("bwd", {}).get("ok"):
            res["first_call"] = first_call(v, d)
        results[v["name"]] = res
        print(json.dumps({v["name"]: res})[:3000], flush=True)
        (a.out / "aoti_backward.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
