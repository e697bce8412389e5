"""`attnforge flex build` on the GPU: a variant's Mega-Cache artifact loads in a fresh process and hits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnforge.flex.aot_build import BuildOptions, build_variants, run_worker

pytestmark = pytest.mark.gpu

VARIANT = {
    "name": "causal-bf16",
    "mask": "causal",
    "window": None,
    "prefix": None,
    "score_mod": "none",
    "softcap": None,
    "dtype": "bf16",
    "head_dim": 128,
    "heads_q": 8,
    "heads_kv": 8,
    "seq_len": 1024,
    "batch": 2,
    "dynamic": False,
    "backward": True,
    "mode": "default",
    "device": "cuda",
}


def test_megacache_round_trip(tmp_path: Path) -> None:
    m = build_variants([VARIANT], BuildOptions(out_dir=tmp_path, aoti=False, jobs=1))
    [e] = m["variants"]
    assert e["megacache"] and e["megacache"]["max_err"] < 0.05
    art = tmp_path / "artifacts" / e["megacache"]["file"]
    cold = run_worker(
        sys.executable, "first-call", VARIANT, ["--mode", "cold", "--backward"], tmp_path / "c1", 600
    )
    warm = run_worker(
        sys.executable,
        "first-call",
        VARIANT,
        ["--mode", "megacache", "--artifact", str(art), "--backward"],
        tmp_path / "c2",
        600,
    )
    assert cold["ok"] and warm["ok"], (cold, warm)
    assert warm["counters"]["inductor"].get("fxgraph_cache_hit", 0) >= 1
    assert warm["seconds"] < cold["seconds"]


def test_fwd_bwd_aoti_packages_build_load_and_match_eager(tmp_path: Path) -> None:
    """A fwd+bwd variant gets a forward and a backward AOTInductor package; attention() runs them as one
    differentiable call whose gradients match eager FlexAttention's."""
    import torch

    from attnforge.flex.runtime import attention, mods

    m = build_variants([VARIANT], BuildOptions(out_dir=tmp_path, aoti=True, precompile=False, jobs=1))
    [e] = m["variants"]
    ao = e["aoti"]
    assert ao["ok"], ao
    assert ao["file"].endswith(".fwd.pt2") and ao["backward_file"].endswith(".bwd.pt2")
    assert ao["grad_max_err"] < 0.1
    fn = attention(VARIANT["name"], tmp_path / "artifacts")
    q, k, v = mods.make_inputs(VARIANT, "cuda", grad=True)
    go = torch.randn_like(q)
    fn(q, k, v).backward(go)
    assert fn.used == "aoti"
    assert q.grad is not None
    got = q.grad.clone()
    q.grad = None
    mods.FlexCall(VARIANT, "cuda", compiled=False)(q, k, v).backward(go)
    assert (got.float() - q.grad.float()).abs().max().item() < 0.1
