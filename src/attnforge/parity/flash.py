"""Run flash-attn parity cases on a GPU: the kernel, the fp32 reference and PyTorch's low-precision math
from the same inputs, forward and (same call) backward."""

from __future__ import annotations

import math
import time
import traceback
from typing import Any

import torch

from attnforge import reference as R
from attnforge.parity.cases import Case
from attnforge.parity.flash_tensors import (
    DTYPES,
    SUITE,
    Inputs,
    autograd_grads,
    case_result,
    fresh_leaf,
    reference_outputs,
    varlen_lengths,
)
from attnforge.parity.parity_report import FAILED, PASSED, SKIPPED, Result
from attnforge.parity.tolerance import BWD_FACTOR, FWD_FACTOR, check

DROPOUT_TOL = 0.01


def run_case(fa: Any, c: Case, device: str = "cuda", seed: int = 0) -> list[Result]:
    """Run one case; returns the forward result and, where the case has one, the backward result."""
    t0 = time.perf_counter()
    try:
        results = _run(fa, c, device, seed)
    except Exception as exc:  # a kernel error is a failed case, never a crashed run
        results = [
            Result(
                SUITE,
                c.kernel_name + ":fwd",
                c.dtype,
                c.shape,
                FAILED,
                reason=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                details={"traceback": traceback.format_exc(limit=4)},
            )
        ]
    dt = time.perf_counter() - t0
    for r in results:
        r.seconds = dt / len(results)
    return results


def _expected_error(fa: Any, c: Case, device: str, seed: int) -> list[Result]:
    inp = Inputs(c, device, seed)
    grad = c.expect_error_in == "bwd"
    q, k, v = fresh_leaf(inp.q, grad), fresh_leaf(inp.k, grad), fresh_leaf(inp.v, grad)
    name = c.kernel_name + (":bwd" if grad else ":fwd") + ":expect-error"
    try:
        out = fa.flash_attn_func(
            q,
            k,
            v,
            dropout_p=c.dropout,
            causal=c.causal,
            window_size=c.window,
            softcap=c.softcap,
            alibi_slopes=inp.slopes,
        )
        if grad:
            out.backward(inp.g)
        if device == "cuda":
            torch.cuda.synchronize()
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else ""
        ok = c.expect_error is not None and c.expect_error.lower() in str(exc).lower()
        reason = f"raised as expected: {msg}" if ok else f"raised, but not the clear message: {msg}"
        return [
            Result(
                SUITE, name, c.dtype, c.shape, PASSED if ok else FAILED, reason=reason, details={"note": msg}
            )
        ]
    return [
        Result(
            SUITE,
            name,
            c.dtype,
            c.shape,
            FAILED,
            reason=f"expected a RuntimeError containing {c.expect_error!r}; the call succeeded",
        )
    ]


def _run(fa: Any, c: Case, device: str, seed: int) -> list[Result]:
    if c.expect_error:
        return _expected_error(fa, c, device, seed)
    if c.kernel == "kvcache":
        return _kvcache(fa, c, device, seed)
    inp = Inputs(c, device, seed)
    grad = c.backward and c.skip_bwd is None
    bias_kw: dict[str, Any] = {}
    notes: dict[str, Any] = {}
    extra_ok = True
    extra_reason = ""
    q, k, v = fresh_leaf(inp.q, grad), fresh_leaf(inp.k, grad), fresh_leaf(inp.v, grad)
    if c.kernel == "func":
        res = fa.flash_attn_func(
            q,
            k,
            v,
            dropout_p=c.dropout,
            causal=c.causal,
            window_size=c.window,
            softcap=c.softcap,
            alibi_slopes=inp.slopes,
            return_attn_probs=c.dropout > 0,
        )
        out = res[0] if c.dropout > 0 else res
        leaves = [q, k, v]
        if c.alibi:
            assert inp.slopes is not None  # an alibi case always has slopes
            bias_kw["bias"] = R.alibi_bias(inp.slopes, c.sq, c.sk, c.causal)
        if c.dropout > 0:
            s_dmask = res[2][:, :, : c.sq, : c.sk]
            blocked = R.blocked_positions(c.sq, c.sk, causal=c.causal, window=c.window, device=device)
            keep = (s_dmask >= 0) | blocked
            frac = R.dropout_fraction(keep, blocked)
            notes = {"dropout_fraction": round(frac, 4), "dropout_p": c.dropout}
            bias_kw.update(dropout_p=c.dropout, dropout_mask=keep)
            if abs(frac - c.dropout) > DROPOUT_TOL:
                extra_ok = False
                extra_reason = f"dropped fraction {frac:.4f}, expected {c.dropout} +- {DROPOUT_TOL}"
            notes.update(_dropout_reproducible(fa, c, inp))
            if not notes["same_seed_same_output"] or not notes["other_seed_other_output"]:
                extra_ok = False
                extra_reason = (extra_reason + "; " if extra_reason else "") + "dropout RNG not reproducible"
    elif c.kernel == "qkvpacked":
        qkv = torch.stack([inp.q, inp.k, inp.v], dim=2).detach().requires_grad_(grad)
        out = fa.flash_attn_qkvpacked_func(qkv, causal=c.causal, window_size=c.window, softcap=c.softcap)
        leaves = [qkv]
    elif c.kernel == "varlen":
        q_lens = varlen_lengths(c.b, c.sq, seed)
        k_lens = varlen_lengths(c.b, c.sk, seed + 1)
        q_pad = R.pad_mask_from_lens(q_lens, c.sq, device)
        k_pad = R.pad_mask_from_lens(k_lens, c.sk, device)
        qu, cu_q, max_q = R.unpad(inp.q, q_pad)
        ku, cu_k, max_k = R.unpad(inp.k, k_pad)
        vu, _, _ = R.unpad(inp.v, k_pad)
        qu, ku, vu = fresh_leaf(qu, grad), fresh_leaf(ku, grad), fresh_leaf(vu, grad)
        out_u = fa.flash_attn_varlen_func(
            qu,
            ku,
            vu,
            cu_q,
            cu_k,
            max_q,
            max_k,
            causal=c.causal,
            window_size=c.window,
            softcap=c.softcap,
        )
        out = R.repad(out_u, q_pad)
        leaves = [qu, ku, vu]
        bias_kw.update(q_pad=q_pad, k_pad=k_pad)
        notes = {"q_lens": q_lens, "k_lens": k_lens}
    else:
        raise ValueError(f"unknown kernel {c.kernel}")
    ref, pt, ref_leaves = reference_outputs(c, inp.q, inp.k, inp.v, grad, **bias_kw)
    fwd = check("out", out, ref[0], pt[0], FWD_FACTOR)
    results = [case_result(c, "fwd", [fwd], extra_ok, extra_reason, notes)]
    if not c.backward:
        return results
    if c.skip_bwd:
        results.append(Result(SUITE, c.kernel_name + ":bwd", c.dtype, c.shape, SKIPPED, reason=c.skip_bwd))
        return results
    g = inp.g
    if c.kernel == "varlen":
        g_u, _, _ = R.unpad(g, bias_kw["q_pad"])
        grads = autograd_grads(out_u, leaves, g_u)
        grads = [
            R.repad(grads[0], bias_kw["q_pad"]),
            R.repad(grads[1], bias_kw["k_pad"]),
            R.repad(grads[2], bias_kw["k_pad"]),
        ]
    elif c.kernel == "qkvpacked":
        grads = list(autograd_grads(out, leaves, g)[0].unbind(2))
    else:
        grads = autograd_grads(out, leaves, g)
    g_ref = autograd_grads(ref[0], ref_leaves[0], g)
    g_pt = autograd_grads(pt[0], ref_leaves[1], g)
    checks = [
        check(n, a, b, p, BWD_FACTOR)
        for n, a, b, p in zip(("dq", "dk", "dv"), grads, g_ref, g_pt, strict=True)
    ]
    results.append(case_result(c, "bwd", checks, True, "", {}))
    return results


def _dropout_reproducible(fa: Any, c: Case, inp: Inputs) -> dict[str, Any]:
    """Same seed -> same output; another seed -> another output."""
    outs = []
    for s in (1234, 1234, 4321):
        torch.manual_seed(s)
        outs.append(fa.flash_attn_func(inp.q, inp.k, inp.v, dropout_p=c.dropout, causal=c.causal))
    return {
        "same_seed_same_output": bool(torch.equal(outs[0], outs[1])),
        "other_seed_other_output": not bool(torch.equal(outs[0], outs[2])),
    }


def _kvcache(fa: Any, c: Case, device: str, seed: int) -> list[Result]:
    """Decode / chunked prefill into a KV cache (contiguous or paged), new K/V appended in place."""
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[c.dtype]

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dt)

    q = rnd(c.b, c.sq, c.hq, c.d)
    k_new = rnd(c.b, c.sq, c.hk, c.d)
    v_new = rnd(c.b, c.sq, c.hk, c.d)
    seqlens = torch.randint(1, c.sk - c.sq + 1, (c.b,), generator=g, dtype=torch.int32).to(device)
    if c.paged:
        n_pages = math.ceil(c.sk / c.paged) * c.b * 2
        k_pages = rnd(n_pages, c.paged, c.hk, c.d)
        v_pages = rnd(n_pages, c.paged, c.hk, c.d)
        per = math.ceil(c.sk / c.paged)
        table = torch.randperm(n_pages, generator=g)[: c.b * per].view(c.b, per).to(torch.int32).to(device)
        k_cache, v_cache = k_pages, v_pages
        kw: dict[str, Any] = {"block_table": table}
    else:
        k_cache = rnd(c.b, c.sk, c.hk, c.d)
        v_cache = rnd(c.b, c.sk, c.hk, c.d)
        kw = {}

    def dense(pages: torch.Tensor) -> torch.Tensor:
        if not c.paged:
            return pages.clone()
        return pages[table.long().flatten()].view(c.b, -1, c.hk, c.d)[:, : c.sk].clone()

    k_before, v_before = dense(k_cache), dense(v_cache)
    out = fa.flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k=k_new,
        v=v_new,
        cache_seqlens=seqlens,
        causal=c.causal,
        window_size=c.window,
        softcap=c.softcap,
        **kw,
    )
    k_after, v_after = dense(k_cache), dense(v_cache)
    # the expected cache: the new tokens written at cache_seqlens[i]
    k_exp, v_exp = k_before.clone(), v_before.clone()
    for i, s in enumerate(seqlens.tolist()):
        k_exp[i, s : s + c.sq] = k_new[i]
        v_exp[i, s : s + c.sq] = v_new[i]
    cache_ok = bool(torch.equal(k_after, k_exp)) and bool(torch.equal(v_after, v_exp))
    k_pad = R.pad_mask_from_lens([int(s) + c.sq for s in seqlens.tolist()], c.sk, device)
    outs = []
    for upcast in (True, False):
        o, _ = R.attention_ref(
            q,
            k_exp,
            v_exp,
            causal=c.causal,
            window=c.window,
            softcap=c.softcap,
            k_pad=k_pad,
            upcast=upcast,
            reorder_ops=not upcast,
        )
        outs.append(o)
    fwd = check("out", out, outs[0], outs[1], FWD_FACTOR)
    notes = {"cache_updated_in_place": cache_ok, "cache_seqlens": seqlens.tolist()}
    return [
        case_result(
            c, "fwd", [fwd], cache_ok, "" if cache_ok else "new K/V not written into the cache", notes
        )
    ]
