"""An FA2 wheel built on torch's stable ABI (`abi: stable`), installed over this machine's torch: its ops are
registered, its extension imports no torch C++ symbol, dropout works (seeded, applied, trainable), a CUDA
graph of a training step with dropout replays like its eager run, torch.compile(fullgraph=True) traces it,
and the KV-cache op writes the cache it is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from attnforge.builder.importcheck import stable_abi_check

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
flash_attn = pytest.importorskip("flash_attn", reason="install the stable-ABI flash_attn wheel under test")
if not hasattr(torch.ops, "flash_attn_stable") or not hasattr(torch.ops.flash_attn_stable, "fwd"):
    pytest.skip("the installed flash_attn is not a stable-ABI build", allow_module_level=True)

DEVICE = "cuda"
B, S, H, D = 2, 256, 4, 128


def qkv(dtype: Any = None, grad: bool = True, seed: int = 0) -> list[Any]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    dtype = dtype or torch.bfloat16
    return [torch.randn(B, S, H, D, generator=g).to(DEVICE, dtype).requires_grad_(grad) for _ in range(3)]


def test_ops_registered_and_no_torch_cxx_symbol() -> None:
    import flash_attn_2_cuda

    for op in ("fwd", "varlen_fwd", "bwd", "varlen_bwd", "fwd_kvcache"):
        assert hasattr(torch.ops.flash_attn_stable, op), op
    leaks = stable_abi_check([Path(flash_attn_2_cuda.__file__)])["leaks"]
    assert not leaks, leaks  # at::/c10::/torch:: C++ symbols the .so imports


def test_dropout_is_seeded_applied_and_trainable() -> None:
    q, k, v = qkv()
    torch.manual_seed(7)
    a = flash_attn.flash_attn_func(q, k, v, dropout_p=0.25, causal=True)
    torch.manual_seed(7)
    b = flash_attn.flash_attn_func(q, k, v, dropout_p=0.25, causal=True)
    c = flash_attn.flash_attn_func(q, k, v, dropout_p=0.25, causal=True)
    assert torch.equal(a, b), "the same seed gave another dropout mask"
    assert not torch.equal(a, c), "a second call reused the mask"
    _, _, s_dmask = flash_attn.flash_attn_func(q, k, v, dropout_p=0.25, causal=False, return_attn_probs=True)
    dropped = (s_dmask[..., :S, :S] < 0).float().mean().item()  # the kernel marks a dropped entry negative
    assert abs(dropped - 0.25) < 0.02, dropped
    a.float().pow(2).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_cuda_graph_of_a_training_step_with_dropout_replays_its_eager_run() -> None:
    q, k, v = qkv()

    def step() -> list[Any]:
        for t in (q, k, v):
            t.grad = None
        out = flash_attn.flash_attn_func(q, k, v, dropout_p=0.1, causal=True)
        out.float().pow(2).sum().backward()
        return [out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    torch.manual_seed(123)
    eager = step()
    torch.manual_seed(123)
    graph.replay()
    torch.cuda.synchronize()
    for name, e, g in zip(("out", "dq", "dk", "dv"), eager, captured, strict=True):
        assert torch.equal(e, g), f"{name}: the replay differs from the eager run"
    graph.replay()
    assert not torch.equal(eager[0], captured[0]), "a second replay reused the mask"


def test_compile_fullgraph() -> None:
    q, k, v = qkv(grad=False)
    eager = flash_attn.flash_attn_func(q, k, v, causal=True)
    compiled = torch.compile(lambda q, k, v: flash_attn.flash_attn_func(q, k, v, causal=True), fullgraph=True)
    assert torch.equal(compiled(q, k, v), eager)


def test_kvcache_writes_the_cache() -> None:
    g = torch.Generator(device="cpu").manual_seed(3)
    cache_len, new = 64, 8
    k_cache = torch.zeros(B, 128, H, D).to(DEVICE, torch.float16)
    v_cache = torch.zeros_like(k_cache)
    k_cache[:, :cache_len] = torch.randn(B, cache_len, H, D, generator=g).to(DEVICE, torch.float16)
    v_cache[:, :cache_len] = torch.randn(B, cache_len, H, D, generator=g).to(DEVICE, torch.float16)
    q, k_new, v_new = (torch.randn(B, new, H, D, generator=g).to(DEVICE, torch.float16) for _ in range(3))
    seqlens = torch.full((B,), cache_len, dtype=torch.int32, device=DEVICE)
    out = flash_attn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=seqlens, causal=True
    )
    assert torch.equal(k_cache[:, cache_len : cache_len + new], k_new)
    assert torch.equal(v_cache[:, cache_len : cache_len + new], v_new)
    keys = k_cache[:, : cache_len + new].float()
    values = v_cache[:, : cache_len + new].float()
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), keys) / D**0.5
    allowed = torch.arange(cache_len + new, device=DEVICE)[None, :] <= (
        cache_len + torch.arange(new, device=DEVICE)[:, None]
    )
    ref = torch.einsum("bhqk,bkhd->bqhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), values)
    assert (out.float() - ref).abs().max().item() < 2e-2
