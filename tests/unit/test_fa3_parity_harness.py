"""The FA3 case runner on CPU, against a reference-math stand-in for ``flash_attn_interface`` built like the
``fa3hd64128`` profile (head dims 64 and 128, bf16, paged KV, split, varlen; no append-KV, local, softcap).

This checks the harness (the API calls FA3 takes, KV-cache bookkeeping with and without appended K/V, the
expected errors and result shapes), not a GPU kernel."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from attnforge import reference as R  # noqa: E402
from attnforge.parity import fa3cases  # noqa: E402
from attnforge.parity.fa3 import SUITE, run_case  # noqa: E402
from attnforge.parity.parity_report import FAILED, PASSED, SKIPPED  # noqa: E402
from attnforge.parity.profile import WheelProfile  # noqa: E402

BUILT = (64, 128)
OFF = frozenset(
    {"appendkv", "local", "softcap", "packgqa", "cluster", "hdimdiff64", "hdimdiff192", "sm80", "fp8"}
)


def _check(q: torch.Tensor, v: torch.Tensor, window: tuple[int, int], softcap: float) -> None:
    d = q.shape[-1]
    if d > max(BUILT):
        raise RuntimeError(f"FlashAttention forward only supports head dimension at most {max(BUILT)}")
    if v.shape[-1] != d:
        raise RuntimeError("This flash attention build does not support V head dim 256 with Q/K head dim 64")
    if q.dtype == torch.float16:
        raise RuntimeError("This flash attention build does not support FP16.")
    if q.dtype == torch.float8_e4m3fn:
        raise RuntimeError("This flash attention build does not support FP8.")
    if tuple(window) != (-1, -1):
        raise RuntimeError("This flash attention build does not support local attention.")
    if softcap:
        raise RuntimeError("This flash attention build does not support tanh softcapping.")


def _func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, num_splits=1, **kw):  # type: ignore[no-untyped-def]
    _check(q, v, window_size, softcap)
    return R.attention_ref(q, k, v, causal=causal, window=tuple(window_size), softcap=softcap)[0]


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, window_size=(-1, -1), softcap=0.0, **kw):  # type: ignore[no-untyped-def]
    outs = []
    for i in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        outs.append(_func(q[None, sq], k[None, sk], v[None, sk], causal=causal, window_size=window_size)[0])
    return torch.cat(outs)


def _kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    cache_seqlens=None,
    page_table=None,
    causal=False,  # type: ignore[no-untyped-def]
    window_size=(-1, -1),
    softcap=0.0,
    num_splits=0,
    **kw,
):
    _check(q, v_cache, window_size, softcap)
    if k is not None:
        raise RuntimeError("This flash attention build does not support appending KV.")
    outs = []
    for i in range(q.shape[0]):
        s = int(cache_seqlens[i])
        if page_table is not None:
            kd = k_cache[page_table[i].long()].reshape(-1, *k_cache.shape[2:])[:s]
            vd = v_cache[page_table[i].long()].reshape(-1, *v_cache.shape[2:])[:s]
        else:
            kd, vd = k_cache[i, :s], v_cache[i, :s]
        outs.append(_func(q[i : i + 1], kd[None], vd[None], causal=causal)[0])
    return torch.stack(outs)


STANDIN = types.SimpleNamespace(
    flash_attn_func=_func, flash_attn_varlen_func=_varlen, flash_attn_with_kvcache=_kvcache
)
PROFILE = WheelProfile(
    name="fa3hd64128", head_dims=BUILT, dtypes=("bf16",), disabled=OFF, kernel="flash-attn-3"
)


def _small(c):  # type: ignore[no-untyped-def]
    return c.sq <= 301 and c.sk <= 1031


def test_every_case_of_the_profile_runs_and_passes_on_the_stand_in() -> None:
    cases = [c for c in fa3cases.fa3_cases(PROFILE, quick=True) if _small(c)]
    results = [r for i, c in enumerate(cases) for r in run_case(STANDIN, c, device="cpu", seed=i)]
    bad = [(r.kernel, r.reason) for r in results if r.status == FAILED]
    assert not bad, bad[:5]
    assert all(r.suite == SUITE for r in results)
    names = [r.kernel for r in results if r.status == PASSED]
    assert any(
        n.startswith("fa3.flash_attn_with_kvcache[gqa,causal,paged128,splits-auto,read-only]") for n in names
    )
    assert any(n.endswith(":expect-error") and "paged128" in n for n in names)  # appending into the cache
    assert any(":bwd" in n and "flash_attn_varlen_func" in n for n in names)
    assert not any(r.status == SKIPPED for r in results)


def test_a_wrong_kernel_fails_its_case() -> None:
    def wrong(q, k, v, **kw):  # type: ignore[no-untyped-def]
        return _func(q, k, v, **kw) * 1.2

    c = next(
        c for c in fa3cases.fa3_cases(PROFILE) if c.kernel == "func" and not c.expect_error and _small(c)
    )
    res = run_case(types.SimpleNamespace(flash_attn_func=wrong), c, device="cpu")
    assert res[0].status == FAILED and "max_err" in res[0].reason


def test_a_kernel_that_runs_what_it_should_refuse_fails() -> None:
    def lenient(q, k, v, **kw):  # type: ignore[no-untyped-def]
        return R.attention_ref(q, k, v)[0]

    c = next(c for c in fa3cases.fa3_cases(PROFILE) if c.expect_error and c.dv == 256)
    res = run_case(types.SimpleNamespace(flash_attn_func=lenient), c, device="cpu")
    assert res[0].status == FAILED and "the call succeeded" in res[0].reason
