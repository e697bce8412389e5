"""FlexAttention forward *and* backward as two AOTInductor packages: a fwd+bwd first call without Dynamo or
Inductor at load.

AOTInductor compiles inference graphs. A training step is made of two: one fwd+bwd call is traced with
``make_fx`` (its graph holds the ``flex_attention`` and ``flex_attention_backward`` operators, the score/mask
graphs and the block mask as constants), then split into a forward graph ``(q, k, v) -> (out, lse)`` and a
backward graph ``(q, k, v, grad_out, out, lse) -> (dq, dk, dv)``; each is exported and compiled. The loader
(``attnforge_flex``) runs them inside an ``autograd.Function``. Measured on the H100 (torch 2.11): first
fwd+bwd call 0.56 s vs 11.0 s cold through the builder, 0.44 s through the wheel (causal;
benchmarks/results/flex_first_call_aoti_train_h100.json, flex_wheel_first_call_aoti_train_h100.json).

The backward graph's example ``out``/``lse`` come from running the forward graph eagerly, which materializes
the score matrix (B x H x S x S fp32: 1 GiB at B4 H16 S2048); a very long static sequence may not fit.

Building needs the GPU: Inductor has no CPU FlexAttention backward. A variant whose trace, export or compile
fails keeps its precompiled function (the builder records why).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

BACKWARD_SUFFIX = ".bwd.pt2"
FORWARD_SUFFIX = ".fwd.pt2"


def backward_path(forward: Path) -> Path:
    """``<name>.bwd.pt2`` next to ``<name>.fwd.pt2``."""
    return forward.with_name(forward.name.removesuffix(FORWARD_SUFFIX) + BACKWARD_SUFFIX)


def trace_and_split(v: dict[str, Any], dev: str) -> tuple[Any, Any, dict[str, Any]]:
    """``make_fx`` of one fwd+bwd call of the variant, split into the forward and backward graphs."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.attention.flex_attention import flex_attention

    from attnforge.flex.runtime import mods  # optional: torch

    bm = mods.block_mask(v, dev)
    sm = mods.score_mod_for(v, dev)
    gqa = mods.gqa(v)
    scale = mods.scale_of(v)

    def step(q: Any, k: Any, vv: Any, go: Any) -> Any:
        q, k, vv = (t.detach().requires_grad_(True) for t in (q, k, vv))
        out = flex_attention(q, k, vv, score_mod=sm, block_mask=bm, enable_gqa=gqa, scale=scale)
        dq, dk, dv = torch.autograd.grad(out, (q, k, vv), go)
        return out, dq, dk, dv

    q, k, vv = mods.make_inputs(v, dev)
    go = torch.randn_like(q)
    with torch.enable_grad():
        gm = make_fx(step, tracing_mode="fake", _allow_non_fake_inputs=True)(q, k, vv, go)
    ops = [n for n in gm.graph.nodes if n.op == "call_function" and "flex_attention" in str(n.target)]
    info = {"ops": [str(n.target).rsplit(".", 1)[-1] for n in ops], "nodes": len(gm.graph.nodes)}
    fwd_op = next((n for n in ops if str(n.target).endswith("flex_attention")), None)
    if fwd_op is None or len(ops) != 2:
        raise RuntimeError(f"expected one forward and one backward FlexAttention op, traced {info['ops']}")
    outs = {u.args[1]: u.name for u in fwd_op.users if u.op == "call_function"}  # getitem index -> node name
    return _forward_graph(gm, outs), _backward_graph(gm, outs), info


def _forward_graph(gm: Any, outs: dict[int, str]) -> Any:
    """(q, k, v) -> (out, lse)."""
    import torch

    g = copy.deepcopy(gm)
    by_name = {n.name: n for n in g.graph.nodes}
    output = next(n for n in g.graph.nodes if n.op == "output")
    output.args = ((by_name[outs[0]], by_name[outs[1]]),)
    g.graph.eliminate_dead_code()
    for ph in [n for n in g.graph.nodes if n.op == "placeholder" and not n.users]:
        g.graph.erase_node(ph)  # grad_out: an unused input would not be an input of the compiled model
    g.recompile()
    return torch.fx.GraphModule(g, g.graph)


def _backward_graph(gm: Any, outs: dict[int, str]) -> Any:
    """(q, k, v, grad_out, out, lse) -> (dq, dk, dv): the forward op's results become inputs."""
    import torch

    g = copy.deepcopy(gm)
    by_name = {n.name: n for n in g.graph.nodes}
    last = [n for n in g.graph.nodes if n.op == "placeholder"][-1]
    output = next(n for n in g.graph.nodes if n.op == "output")
    output.args = (tuple(output.args[0][1:]),)  # the gradients, not out
    with g.graph.inserting_after(last):
        lse_in = g.graph.placeholder("lse_in")
    with g.graph.inserting_after(last):
        out_in = g.graph.placeholder("out_in")
    by_name[outs[0]].replace_all_uses_with(out_in)
    by_name[outs[1]].replace_all_uses_with(lse_in)
    g.graph.eliminate_dead_code()
    if any(n.op == "call_function" and str(n.target).endswith(".flex_attention") for n in g.graph.nodes):
        raise RuntimeError("the backward graph still needs the forward op (an output other than out and lse)")
    g.recompile()
    return torch.fx.GraphModule(g, g.graph)


def build(v: dict[str, Any], dev: str, forward: Path) -> dict[str, Any]:
    """Trace, split, export and compile the variant into ``forward`` (``<name>.fwd.pt2``) and its
    ``backward_path``; returns the seconds each step took."""
    import torch

    from attnforge.flex.runtime import mods  # optional: torch

    t0 = time.perf_counter()
    fwd, bwd, info = trace_and_split(v, dev)
    trace_s = time.perf_counter() - t0
    q, k, vv = mods.make_inputs(v, dev)
    go = torch.randn_like(q)
    with torch.no_grad():
        o, lse = fwd(q, k, vv)
    times = {}
    for gmod, args, path in (
        (fwd, (q, k, vv), forward),
        (bwd, (q, k, vv, go, o, lse), backward_path(forward)),
    ):
        t1 = time.perf_counter()
        ep = torch.export.export(gmod, args, strict=False)
        torch._inductor.aoti_compile_and_package(ep, package_path=str(path))
        times[path.name] = round(time.perf_counter() - t1, 2)
    return {"trace_s": round(trace_s, 2), "compile_s": times, **info}
