"""Run FlashAttention-3 parity cases (``flash_attn_interface``) on a GPU: the kernel, the fp32 reference and
PyTorch's low-precision math from the same inputs, forward and (same call) backward. The cases, the inputs,
the reference and the tolerance are the FA2 suite's (``fa3cases``, ``flash``, ``reference``, ``tolerance``)."""

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
    Inputs,
    autograd_grads,
    case_result,
    fresh_leaf,
    reference_outputs,
    varlen_lengths,
)
from attnforge.parity.parity_report import FAILED, PASSED, SKIPPED, Result
from attnforge.parity.tolerance import BWD_FACTOR, FWD_FACTOR, check

SUITE = "flash_attn_3"


def _inputs(c: Case, device: str, seed: int) -> Inputs:
    """FA2's inputs; fp8 cases draw in bf16 and quantize to e4m3 (the reference sees the quantized values)."""
    if c.dtype != "fp8":
        return Inputs(c, device, seed)
    inp = Inputs(Case(**{**c.__dict__, "dtype": "bf16"}), device, seed)
    for name in ("q", "k", "v"):
        setattr(inp, name, getattr(inp, name).to(torch.float8_e4m3fn))
    return inp


def run_case(fa3: Any, c: Case, device: str = "cuda", seed: int = 0) -> list[Result]:
    """Run one case; returns the forward result and, where the case has one, the backward result."""
    t0 = time.perf_counter()
    try:
        results = _expected_error(fa3, c, device, seed) if c.expect_error else _run(fa3, c, device, seed)
    except Exception as exc:  # a kernel error is a failed case, never a crashed run
        msg = str(exc).splitlines()[0] if str(exc) else ""
        results = [
            Result(
                SUITE,
                c.kernel_name + ":fwd",
                c.dtype,
                c.shape,
                FAILED,
                reason=f"{type(exc).__name__}: {msg}",
                details={"traceback": traceback.format_exc(limit=4)},
            )
        ]
    for r in results:
        r.seconds = (time.perf_counter() - t0) / len(results)
    return results


def _call(fa3: Any, c: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    out = fa3.flash_attn_func(
        q, k, v, causal=c.causal, window_size=c.window, softcap=c.softcap, num_splits=c.splits
    )
    return out[0] if isinstance(out, tuple) else out


def _expected_error(fa3: Any, c: Case, device: str, seed: int) -> list[Result]:
    grad = c.expect_error_in == "bwd"
    name = c.kernel_name + (":bwd" if grad else ":fwd") + ":expect-error"
    try:
        if c.kernel == "func":
            inp = _inputs(c, device, seed)
            q, k, v = (fresh_leaf(t, grad) for t in (inp.q, inp.k, inp.v))
            out = _call(fa3, c, q, k, v)
            if grad:
                out.backward(inp.g)
        else:
            _run(fa3, c, device, seed)
        if device == "cuda":
            torch.cuda.synchronize()
    except (RuntimeError, AssertionError) as exc:
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


def _run(fa3: Any, c: Case, device: str, seed: int) -> list[Result]:
    if c.kernel == "kvcache":
        return _kvcache(fa3, c, device, seed)
    inp = _inputs(c, device, seed)
    grad = c.backward and c.skip_bwd is None
    bias_kw: dict[str, Any] = {}
    notes: dict[str, Any] = {"note": c.note} if c.note else {}
    q, k, v = (fresh_leaf(t, grad) for t in (inp.q, inp.k, inp.v))
    if c.kernel == "func":
        out = _call(fa3, c, q, k, v)
        leaves = [q, k, v]
    elif c.kernel == "varlen":
        q_lens, k_lens = varlen_lengths(c.b, c.sq, seed), varlen_lengths(c.b, c.sk, seed + 1)
        q_pad, k_pad = R.pad_mask_from_lens(q_lens, c.sq, device), R.pad_mask_from_lens(k_lens, c.sk, device)
        (qu, cu_q, max_q), (ku, cu_k, max_k) = R.unpad(inp.q, q_pad), R.unpad(inp.k, k_pad)
        vu = R.unpad(inp.v, k_pad)[0]
        qu, ku, vu = fresh_leaf(qu, grad), fresh_leaf(ku, grad), fresh_leaf(vu, grad)
        res = fa3.flash_attn_varlen_func(
            qu, ku, vu, cu_q, cu_k, max_q, max_k, causal=c.causal, window_size=c.window, softcap=c.softcap
        )
        out_u = res[0] if isinstance(res, tuple) else res
        out = R.repad(out_u, q_pad)
        leaves = [qu, ku, vu]
        bias_kw.update(q_pad=q_pad, k_pad=k_pad)
        notes.update(q_lens=q_lens, k_lens=k_lens)
    else:
        raise ValueError(f"unknown FA3 kernel {c.kernel}")
    ref_in = [t.to(torch.bfloat16) if c.dtype == "fp8" else t for t in (inp.q, inp.k, inp.v)]
    ref, pt, ref_leaves = reference_outputs(c, ref_in[0], ref_in[1], ref_in[2], grad, **bias_kw)
    results = [case_result(c, "fwd", [check("out", out, ref[0], pt[0], FWD_FACTOR)], True, "", notes, SUITE)]
    if not c.backward:
        return results
    if c.skip_bwd:
        return results + [Result(SUITE, c.kernel_name + ":bwd", c.dtype, c.shape, SKIPPED, reason=c.skip_bwd)]
    g = inp.g
    if c.kernel == "varlen":
        grads = autograd_grads(out_u, leaves, R.unpad(g, bias_kw["q_pad"])[0])
        grads = [
            R.repad(grads[0], bias_kw["q_pad"]),
            R.repad(grads[1], bias_kw["k_pad"]),
            R.repad(grads[2], bias_kw["k_pad"]),
        ]
    else:
        grads = autograd_grads(out, leaves, g)
    g_ref, g_pt = autograd_grads(ref[0], ref_leaves[0], g), autograd_grads(pt[0], ref_leaves[1], g)
    checks = [
        check(n, a, b, p, BWD_FACTOR)
        for n, a, b, p in zip(("dq", "dk", "dv"), grads, g_ref, g_pt, strict=True)
    ]
    return results + [case_result(c, "bwd", checks, True, "", {}, SUITE)]


def _kvcache(fa3: Any, c: Case, device: str, seed: int) -> list[Result]:
    """Decode / chunked prefill against a KV cache (contiguous or paged through ``page_table``), with
    ``cache_seqlens``; new K/V appended in place when the case appends."""
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[c.dtype]

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dt)

    q = rnd(c.b, c.sq, c.hq, c.d)
    k_new, v_new = rnd(c.b, c.sq, c.hk, c.d), rnd(c.b, c.sq, c.hk, c.d)
    seqlens = torch.randint(c.sq, c.sk - c.sq + 1, (c.b,), generator=g, dtype=torch.int32).to(device)
    kw: dict[str, Any] = {}
    if c.paged:
        per = math.ceil(c.sk / c.paged)
        n_pages = per * c.b * 2
        k_cache, v_cache = rnd(n_pages, c.paged, c.hk, c.d), rnd(n_pages, c.paged, c.hk, c.d)
        table = torch.randperm(n_pages, generator=g)[: c.b * per].view(c.b, per).to(torch.int32).to(device)
        kw["page_table"] = table
    else:
        k_cache, v_cache = rnd(c.b, c.sk, c.hk, c.d), rnd(c.b, c.sk, c.hk, c.d)

    def dense(pages: torch.Tensor) -> torch.Tensor:
        if not c.paged:
            return pages.clone()
        return pages[table.long().flatten()].view(c.b, -1, c.hk, c.d)[:, : c.sk].clone()

    k_before, v_before = dense(k_cache), dense(v_cache)
    if c.append:
        kw.update(k=k_new, v=v_new)
    out = fa3.flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        cache_seqlens=seqlens,
        causal=c.causal,
        window_size=c.window,
        softcap=c.softcap,
        num_splits=c.splits,
        **kw,
    )
    out = out[0] if isinstance(out, tuple) else out
    k_after, v_after = dense(k_cache), dense(v_cache)
    k_exp, v_exp = k_before.clone(), v_before.clone()
    lens = [int(s) for s in seqlens.tolist()]
    if c.append:
        for i, s in enumerate(lens):
            k_exp[i, s : s + c.sq], v_exp[i, s : s + c.sq] = k_new[i], v_new[i]
    cache_ok = bool(torch.equal(k_after, k_exp)) and bool(torch.equal(v_after, v_exp))
    k_pad = R.pad_mask_from_lens([s + (c.sq if c.append else 0) for s in lens], c.sk, device)
    outs = [
        R.attention_ref(
            q,
            k_exp,
            v_exp,
            causal=c.causal,
            window=c.window,
            softcap=c.softcap,
            k_pad=k_pad,
            upcast=up,
            reorder_ops=not up,
        )[0]
        for up in (True, False)
    ]
    fwd = check("out", out, outs[0], outs[1], FWD_FACTOR)
    what = "new K/V not written into the cache" if c.append else "the cache changed in a call without new K/V"
    notes = {"cache_as_expected": cache_ok, "cache_seqlens": lens}
    return [case_result(c, "fwd", [fwd], cache_ok, "" if cache_ok else what, notes, SUITE)]
