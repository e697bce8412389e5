"""The fwd+bwd AOTInductor probe's graph split (benchmarks/flex_aoti_backward.py), on CPU.

The compiled packages need a GPU (Inductor has no CPU FlexAttention backward; results in
benchmarks/results/flex_aoti_backward_h100.json). What CPU can check is the split itself: one fwd+bwd trace
becomes a forward graph ``(q, k, v) -> (out, lse)`` without the backward op and a backward graph
``(q, k, v, grad_out, out, lse) -> (dq, dk, dv)`` without the forward op, and run eagerly the two give
FlexAttention's own output and gradients. The CPU backward check of torch is lifted for this (stand-in for
the GPU, which has the kernel)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "flex_aoti_backward.py"


@pytest.fixture()
def probe(monkeypatch: pytest.MonkeyPatch) -> Any:
    import torch.nn.attention.flex_attention as fa

    monkeypatch.setattr(fa, "_validate_device", lambda q, k, v: None)
    spec = importlib.util.spec_from_file_location("flex_aoti_backward", PROBE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "flex_aoti_backward", mod)
    spec.loader.exec_module(mod)
    return mod


def _ops(gm: Any) -> list[str]:
    return [str(n.target).rsplit(".", 1)[-1] for n in gm.graph.nodes if "flex_attention" in str(n.target)]


@pytest.mark.parametrize("mask", ["causal", "sliding_window"])
def test_split_graphs_give_flex_attention_output_and_gradients(probe: Any, mask: str) -> None:
    from torch.nn.attention.flex_attention import flex_attention

    from attnforge.flex.runtime import mods

    v = probe.variant("cpu", mask) | {"dtype": "fp16", "seq_len": 128}
    fwd, bwd, info = probe.trace_and_split(v, "cpu")
    assert info["hops"] == ["flex_attention", "flex_attention_backward"]
    assert _ops(fwd) == ["flex_attention"]
    assert _ops(bwd) == ["flex_attention_backward"]
    assert len([n for n in fwd.graph.nodes if n.op == "placeholder"]) == 3
    assert len([n for n in bwd.graph.nodes if n.op == "placeholder"]) == 6

    q, k, vv = mods.make_inputs(v, "cpu", grad=True)
    go = torch.randn_like(q)
    ref = flex_attention(q, k, vv, block_mask=mods.block_mask(v, "cpu"))
    ref.backward(go)
    with torch.no_grad():
        out, lse = fwd(q.detach(), k.detach(), vv.detach())
        grads = bwd(q.detach(), k.detach(), vv.detach(), go, out, lse)
    assert torch.allclose(out.float(), ref.detach().float(), atol=2e-3)
    for g, t in zip(grads, (q, k, vv), strict=True):
        assert t.grad is not None
        assert torch.allclose(g.float(), t.grad.float(), atol=2e-2), (g - t.grad).abs().max()
