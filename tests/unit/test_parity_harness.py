"""The flash-attn case runner itself, on CPU, against a reference-math stand-in for the ``flash_attn`` module.

This checks the harness (inputs, varlen packing, paged KV-cache bookkeeping, dropout statistics, expected
errors, result shapes), not a GPU kernel: the stand-in computes what flash-attn is specified to compute."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from attnforge import reference as R  # noqa: E402
from attnforge.parity import cases as C  # noqa: E402
from attnforge.parity import profile as P  # noqa: E402
from attnforge.parity.flash import run_case  # noqa: E402
from attnforge.parity.parity_report import FAILED, PASSED, SKIPPED  # noqa: E402

BUILT = (128, 120)


def _func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    if q.shape[-1] not in BUILT:
        raise RuntimeError(
            "this flash-attn wheel (attnforge profile fwd128: head dims [128], dtypes [bf16], forward only) "
            f"has no kernel for head dim {q.shape[-1]}: a wheel of a profile with head dim {q.shape[-1]} serves it"
        )
    if q.dtype != torch.bfloat16:
        raise RuntimeError(
            "this flash-attn wheel (attnforge profile fwd128: head dims [128], dtypes [bf16], forward only) "
            "has no fp16 kernels: a wheel of a profile with fp16 serves it"
        )
    bias = R.alibi_bias(alibi_slopes, q.shape[1], k.shape[1], causal) if alibi_slopes is not None else None
    keep = torch.rand(q.shape[0], q.shape[2], q.shape[1], k.shape[1]) >= dropout_p if dropout_p > 0 else None
    out, probs = R.attention_ref(
        q,
        k,
        v,
        causal=causal,
        window=tuple(window_size),
        softcap=softcap,
        bias=bias,
        dropout_p=dropout_p,
        dropout_mask=keep,
    )
    if return_attn_probs:
        s = probs.float().abs() + 1e-3
        return out, None, torch.where(keep, s, -s)
    return out


def _qkvpacked(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, **kw):
    q, k, v = qkv.unbind(2)
    return _func(q, k, v, causal=causal, window_size=window_size, softcap=softcap)


def _varlen(
    q,
    k,
    v,
    cu_q,
    cu_k,
    max_q,
    max_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    **kw,
):
    outs = []
    for i in range(len(cu_q) - 1):
        sl_q, sl_k = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        outs.append(
            _func(
                q[None, sl_q],
                k[None, sl_k],
                v[None, sl_k],
                causal=causal,
                window_size=window_size,
                softcap=softcap,
            )[0]
        )
    return torch.cat(outs)


def _kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    cache_seqlens=None,
    block_table=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    **kw,
):
    b, sq = q.shape[:2]
    outs = []
    for i in range(b):
        s = int(cache_seqlens[i])
        if block_table is not None:
            page = k_cache.shape[1]
            for t in range(sq):
                pg = int(block_table[i, (s + t) // page])
                k_cache[pg, (s + t) % page] = k[i, t]
                v_cache[pg, (s + t) % page] = v[i, t]
            kd = k_cache[block_table[i].long()].reshape(-1, *k_cache.shape[2:])[: s + sq]
            vd = v_cache[block_table[i].long()].reshape(-1, *v_cache.shape[2:])[: s + sq]
        else:
            k_cache[i, s : s + sq] = k[i]
            v_cache[i, s : s + sq] = v[i]
            kd, vd = k_cache[i, : s + sq], v_cache[i, : s + sq]
        outs.append(
            _func(q[i : i + 1], kd[None], vd[None], causal=causal, window_size=window_size, softcap=softcap)[
                0
            ]
        )
    return torch.stack(outs)


STANDIN = types.SimpleNamespace(
    flash_attn_func=_func,
    flash_attn_qkvpacked_func=_qkvpacked,
    flash_attn_varlen_func=_varlen,
    flash_attn_with_kvcache=_kvcache,
)
PROFILE = P.WheelProfile(name="hd128bf16", head_dims=(128,), dtypes=("bf16",))


def _pick(**want: object) -> C.Case:
    for c in C.flash_cases(PROFILE):
        if all(getattr(c, k) == v for k, v in want.items()):
            return c
    raise LookupError(want)


@pytest.mark.parametrize(
    "want",
    [
        {"kernel": "func", "heads": "gqa", "causal": True, "sq": 113},
        {"kernel": "func", "dropout": C.DROPOUT_P, "causal": False},
        {"kernel": "func", "alibi": True, "causal": True},
        {"kernel": "qkvpacked", "causal": True},
        {"kernel": "varlen", "causal": True, "window": C.WINDOW},
        {"kernel": "kvcache", "paged": C.PAGE, "sq": 64},
        {"kernel": "kvcache", "paged": 0, "sq": 1},
    ],
)
def test_working_cases_pass_against_a_correct_standin(want: dict) -> None:
    results = run_case(STANDIN, _pick(**want), device="cpu", seed=3)
    assert results and all(r.status == PASSED for r in results), [(r.name, r.reason) for r in results]
    if _pick(**want).kernel != "kvcache":
        assert [r.kernel.rsplit(":", 1)[-1] for r in results] == ["fwd", "bwd"]
    assert all(r.ratio_vs_torch is not None and r.max_err is not None for r in results)


def test_expected_errors_pass_when_raised_clearly() -> None:
    errs = [c for c in C.flash_cases(PROFILE) if c.expect_error]
    for c in errs:
        [r] = run_case(STANDIN, c, device="cpu")
        assert r.status == PASSED and "raised as expected" in r.reason


def test_a_wrong_kernel_fails_and_a_missing_backward_is_skipped() -> None:
    def broken(q, k, v, **kw):
        return _func(q, k, v, **{**kw, "causal": False})  # ignores causal

    bad = types.SimpleNamespace(**{**vars(STANDIN), "flash_attn_func": broken})
    res = run_case(bad, _pick(kernel="func", heads="mha", causal=True, sq=113), device="cpu")
    assert res[0].status == FAILED and "bound" in res[0].reason
    nobwd = P.WheelProfile(
        name="inference", head_dims=(128,), dtypes=("bf16",), disabled=frozenset({"backward"})
    )
    c = next(c for c in C.flash_cases(nobwd) if c.kernel == "func" and not c.expect_error)
    fwd, bwd = run_case(STANDIN, c, device="cpu")
    assert fwd.status == PASSED and bwd.status == SKIPPED and "without backward" in bwd.reason
