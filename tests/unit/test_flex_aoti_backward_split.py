"""The fwd+bwd AOTInductor builder's graph split (attnforge.flex.aoti_train), on CPU.

The compiled packages need a GPU (Inductor has no CPU FlexAttention backward; results in
benchmarks/results/flex_aoti_backward_h100.json). What CPU can check is the split itself: one fwd+bwd trace
becomes a forward graph ``(q, k, v) -> (out, lse)`` without the backward op and a backward graph
``(q, k, v, grad_out, out, lse) -> (dq, dk, dv)`` without the forward op, and run eagerly the two give
FlexAttention's own output and gradients. The CPU backward check of torch is lifted for this (stand-in for
the GPU, which has the kernel)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture()
def split(monkeypatch: pytest.MonkeyPatch) -> Any:
    import torch.nn.attention.flex_attention as fa

    from attnforge.flex import aoti_train

    monkeypatch.setattr(fa, "_validate_device", lambda q, k, v: None)
    return aoti_train.trace_and_split


def _ops(gm: Any) -> list[str]:
    return [str(n.target).rsplit(".", 1)[-1] for n in gm.graph.nodes if "flex_attention" in str(n.target)]


@pytest.mark.parametrize("mask", ["causal", "sliding_window"])
def test_split_graphs_give_flex_attention_output_and_gradients(split: Any, mask: str) -> None:
    from torch.nn.attention.flex_attention import flex_attention

    from attnforge.flex.runtime import mods

    v = {
        "name": f"{mask}-fwdbwd",
        "mask": mask,
        "window": 32,
        "score_mod": "none",
        "dtype": "fp16",
        "backward": True,
        "device": "cpu",
        "batch": 1,
        "heads_q": 2,
        "heads_kv": 2,
        "head_dim": 64,
        "seq_len": 128,
    }
    fwd, bwd, info = split(v, "cpu")
    assert info["ops"] == ["flex_attention", "flex_attention_backward"]
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


def test_backward_package_sits_next_to_the_forward_one() -> None:
    from pathlib import Path

    from attnforge.flex.aoti_train import backward_path

    assert backward_path(Path("/a/causal-fwdbwd.fwd.pt2")) == Path("/a/causal-fwdbwd.bwd.pt2")


def test_train_packages_route_gradients_through_the_backward_package() -> None:
    """The autograd wiring of a fwd+bwd pair. Stand-ins for the two compiled packages (they need a GPU to
    build): plain functions with the packages' signatures."""
    from attnforge.flex.runtime import TrainPackages

    seen: dict[str, Any] = {}

    def fwd(q: Any, k: Any, v: Any) -> list[Any]:
        return [q * 2 + k + v, q.sum(-1)]

    def bwd(q: Any, k: Any, v: Any, go: Any, out: Any, lse: Any) -> list[Any]:
        seen.update(contiguous=go.is_contiguous(), out=out, lse=lse)
        return [go * 2, go, go * 3]

    q, k, v = (torch.randn(1, 2, 8, 4, requires_grad=True) for _ in range(3))
    out = TrainPackages(fwd, bwd)(q, k, v)
    go = torch.randn(1, 2, 4, 8).transpose(-1, -2)  # non-contiguous: the backward package gets it contiguous
    out.backward(go)
    assert seen["contiguous"] and torch.equal(seen["out"], out.detach())
    assert torch.equal(seen["lse"], q.detach().sum(-1))
    assert q.grad is not None and k.grad is not None and v.grad is not None
    assert torch.equal(q.grad, go * 2) and torch.equal(k.grad, go) and torch.equal(v.grad, go * 3)
