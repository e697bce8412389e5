"""FlexAttention (``torch.compile(flex_attention)``) against the same fp32 reference: causal, sliding
window, document (packed varlen) and prefix-LM masks, ALiBi and softcap score_mods, GQA; fwd and bwd.

Runs on CUDA (compiled, fwd + bwd) and on CPU (Inductor's CPU FlexAttention: forward only; ``compiled=False``
uses the eager path, which is what the unit tests take)."""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch

from attnforge import reference as R
from attnforge.flex.runtime import mods
from attnforge.parity.parity_report import FAILED, PASSED, Result
from attnforge.parity.tolerance import BWD_FACTOR, FWD_FACTOR, check, worst

SUITE = "flex"


def parity_variants(seq_len: int = 1021, dtypes: tuple[str, ...] = ("bf16", "fp16")) -> list[dict[str, Any]]:
    """The Flex cases of the GPU suite (odd sequence length on purpose)."""
    base = {
        "seq_len": seq_len,
        "batch": 2,
        "heads_q": 8,
        "heads_kv": 8,
        "head_dim": 128,
        "score_mod": "none",
        "dynamic": False,
        "backward": True,
        "mode": "default",
        "device": "cuda",
    }
    out: list[dict[str, Any]] = []
    for dt in dtypes:
        out += [
            base | {"name": f"causal-{dt}", "mask": "causal", "dtype": dt},
            base
            | {
                "name": f"swa-gqa-{dt}",
                "mask": "sliding_window",
                "window": 128,
                "heads_kv": 2,
                "head_dim": 64,
                "dtype": dt,
            },
            base | {"name": f"document-{dt}", "mask": "document", "dtype": dt},
            base
            | {
                "name": f"prefix-alibi-{dt}",
                "mask": "prefix_lm",
                "prefix": 300,
                "score_mod": "alibi",
                "head_dim": 64,
                "dtype": dt,
            },
            base
            | {
                "name": f"full-softcap-gqa-{dt}",
                "mask": "full",
                "score_mod": "softcap",
                "softcap": 30.0,
                "heads_kv": 2,
                "dtype": dt,
            },
        ]
    return out


def shape_of(v: dict[str, Any]) -> str:
    return f"b{v['batch']} s{v['seq_len']} h{v['heads_q']}/{v['heads_kv']} d{v['head_dim']}"


def kernel_of(v: dict[str, Any], compiled: bool) -> str:
    feats = [v["mask"]]
    if v.get("mask") == "sliding_window":
        feats[-1] += str(v["window"])
    if v.get("mask") == "prefix_lm":
        feats[-1] += str(v["prefix"])
    if (v.get("score_mod") or "none") != "none":
        feats.append(str(v["score_mod"]))
    if v["heads_q"] != v["heads_kv"]:
        feats.append("gqa")
    return f"flex_attention{'' if compiled else '(eager)'}[{','.join(feats)}]"


def run_variant(
    v: dict[str, Any], device: str, compiled: bool = True, backward: bool | None = None
) -> list[Result]:
    """Forward (and backward where asked and possible) of one variant vs the fp32 reference."""
    bwd = bool(v.get("backward")) if backward is None else backward
    bwd = bwd and device != "cpu"  # FlexAttention has no backward on CPU (eager or compiled)
    name = kernel_of(v, compiled)
    t0 = time.perf_counter()
    try:
        res = _run(v, device, compiled, bwd, name)
    except Exception as exc:
        msg = str(exc).strip().splitlines()
        res = [
            Result(
                SUITE,
                name + ":fwd",
                v["dtype"],
                shape_of(v),
                FAILED,
                reason=f"{type(exc).__name__}: {msg[0] if msg else ''}",
                details={"traceback": traceback.format_exc(limit=4)},
            )
        ]
    for r in res:
        r.seconds = (time.perf_counter() - t0) / len(res)
    return res


def _run(v: dict[str, Any], device: str, compiled: bool, bwd: bool, name: str) -> list[Result]:
    q, k, vv = mods.make_inputs(v, device, grad=bwd, seed=7)
    call = mods.FlexCall(v, device, compiled=compiled)
    out = call(q, k, vv)
    s = int(v["seq_len"])
    mask = mods.dense_mask(v, s, device)
    bias = mods.dense_bias(v, s, device)
    cap = float(v["softcap"]) if v.get("score_mod") == "softcap" else 0.0
    refs, leaves = [], []
    for upcast in (True, False):
        lq, lk, lv = (t.detach().transpose(1, 2).clone().requires_grad_(bwd) for t in (q, k, vv))
        o, _ = R.attention_ref(
            lq, lk, lv, mask=mask, bias=bias, softcap=cap, upcast=upcast, reorder_ops=not upcast
        )
        refs.append(o.transpose(1, 2))
        leaves.append([lq, lk, lv])
    fwd = check("out", out, refs[0], refs[1], FWD_FACTOR)
    results = [_result(name + ":fwd", v, [fwd])]
    if bwd:
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out)
        grads = torch.autograd.grad(out, (q, k, vv), g)
        g_ref = torch.autograd.grad(refs[0], leaves[0], g)
        g_pt = torch.autograd.grad(refs[1], leaves[1], g)
        checks = [
            check(n, a, b.transpose(1, 2), p.transpose(1, 2), BWD_FACTOR)
            for n, a, b, p in zip(("dq", "dk", "dv"), grads, g_ref, g_pt, strict=True)
        ]
        results.append(_result(name + ":bwd", v, checks))
    return results


def _result(kernel: str, v: dict[str, Any], checks: list[Any]) -> Result:
    w = worst(checks)
    ok = all(c.ok for c in checks)
    reason = "" if ok else f"{w.name}: max_err {w.max_err:.3g} > bound {w.bound:.3g}"
    details = {c.name: {"max_err": c.max_err, "torch_err": c.torch_err, "ratio": c.ratio} for c in checks}
    return Result(
        SUITE,
        kernel,
        v["dtype"],
        shape_of(v),
        PASSED if ok else FAILED,
        max_err=w.max_err,
        ratio_vs_torch=w.ratio,
        reason=reason,
        details=details,
    )
