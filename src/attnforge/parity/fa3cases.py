"""The FlashAttention-3 parity cases a wheel's profile calls for (``flash_attn_interface``). Standard library only.

Every built (dtype, head dim) gets ``flash_attn_func`` (MHA/GQA/MQA, causal and not, odd lengths; forward and
backward), split-KV forward (``num_splits``), ``flash_attn_varlen_func``, and ``flash_attn_with_kvcache`` the way
inference servers call it (decode and chunked prefill, paged KV with ``cache_seqlens`` and the split heuristic,
new K/V appended where append-KV was compiled). A head dim between two compiled ones must run the next larger
kernel. What the profile left out must raise FA3's own clear ``RuntimeError``: a head dim above the largest
compiled one ("head dimension at most N"), a dtype ("does not support FP16"), a feature ("does not support
paged KV", ... ), backward. fp8 (e4m3) is checked forward only: FA3 has no fp8 backward.
"""

from __future__ import annotations

from dataclasses import replace

from attnforge.core.kernels import head_dims as kernel_head_dims
from attnforge.parity.cases import ERR_FEATURE, ERR_HEAD_DIM, HEADS, SOFTCAP, WINDOW, Case
from attnforge.parity.profile import WheelProfile

FA3_HEAD_DIMS: tuple[int, ...] = kernel_head_dims("flash-attn-3")
PAGE = 128  # a page size upstream's hopper tests use


def _c(kernel: str, dtype: str, d: int, **kw: object) -> Case:
    return Case(kernel=kernel, dtype=dtype, d=d, impl="fa3", **kw)  # type: ignore[arg-type]


def working_cases(p: WheelProfile, dtype: str, d: int) -> list[Case]:
    """Cases that must compute the right answer for a built (dtype, head dim)."""
    bwd = dtype != "fp8"
    cases: list[Case] = []
    for heads in HEADS:
        for causal in (False, True):
            cases.append(_c("func", dtype, d, heads=heads, causal=causal, b=2, sq=113, sk=203, backward=bwd))
            cases.append(
                _c("func", dtype, d, heads=heads, causal=causal, b=1, sq=1023, sk=1024, backward=bwd)
            )
    if dtype == "fp8":  # e4m3 has forward kernels only (the output is bf16)
        return [_gate(p, c) for c in cases]
    feat = {"heads": "gqa", "b": 2, "sq": 257, "sk": 511}
    for causal in (False, True):
        cases.append(_c("func", dtype, d, causal=causal, window=WINDOW, **feat))
        cases.append(_c("func", dtype, d, causal=causal, softcap=SOFTCAP, **feat))
        cases.append(_c("varlen", dtype, d, causal=causal, heads="gqa", b=3, sq=301, sk=433))
    cases.append(
        _c("func", dtype, d, causal=True, heads="gqa", b=1, sq=64, sk=4096, splits=3, backward=False)
    )
    for paged in (0, PAGE):
        for append in (False, True):
            common = {"heads": "gqa", "causal": True, "paged": paged, "append": append, "backward": False}
            cases.append(_c("kvcache", dtype, d, b=3, sq=1, sk=777, splits=0, **common))
            cases.append(_c("kvcache", dtype, d, b=2, sq=64, sk=1031, **common))
    # paged chunked prefill may take FA3's TMA paged path, which a build without paged KV still has: whether
    # it raises is not knowable here, so that case only runs where paged KV is built
    cases = [c for c in cases if not (c.paged and c.sq > 1 and not p.has("pagedkv"))]
    return [_gate(p, c) for c in cases]


def needs(c: Case) -> list[str]:
    """The FA3 features a case calls (kernels.json names)."""
    out = []
    if c.window != (-1, -1):
        out.append("local")
    if c.softcap:
        out.append("softcap")
    if c.kernel == "varlen" or c.kernel == "kvcache":  # cache_seqlens is FA3's seqused_k: the varlen path
        out.append("varlen")
    if c.paged:
        out.append("pagedkv")
    if c.splits > 1:  # 0 (the heuristic) is one split in a build without split-KV: no error
        out.append("split")
    if c.kernel == "kvcache" and c.append:
        out.append("appendkv")
    return out


def _gate(p: WheelProfile, c: Case) -> Case:
    """A case that needs a compiled-out feature becomes an expected-error case; no backward: skipped."""
    if c.expect_error:
        return c
    if any(not p.has(f) for f in needs(c)):
        return replace(c, expect_error=ERR_FEATURE, backward=False)
    if c.backward and not p.backward:
        return replace(c, skip_bwd=f"profile '{p.name}' was built without backward")
    return c


def rounding_cases(p: WheelProfile) -> list[Case]:
    """Head dims that are not compiled but below the largest compiled one run the next larger kernel."""
    out = []
    dtype = p.dtypes[0]
    for d in FA3_HEAD_DIMS:
        if d not in p.head_dims and d < max(p.head_dims):
            up = min(x for x in p.head_dims if x > d)
            note = f"head dim {d} is not compiled: runs the hdim{up} kernel (round_up_headdim)"
            out.append(
                _gate(p, _c("func", dtype, d, heads="gqa", causal=True, b=2, sq=129, sk=257, note=note))
            )
    return out


def v_dim_cases(p: WheelProfile) -> list[Case]:
    """A V head dim other than Q/K's (64 x 256, 64 x 512, 192 x 128): computed where the build has the kernel,
    else refused (attnforge's fa3-dispatch-guard patch; upstream would run the wrong kernel)."""
    out = []
    dtype = next((d for d in p.dtypes if d != "fp8"), "bf16")
    for d, dv, feature in ((64, 256, "hdimdiff64"), (64, 512, "hdimdiff64"), (192, 128, "hdimdiff192")):
        if d > max(p.head_dims):
            continue  # the head dim error comes first
        built = d in p.head_dims and p.has(feature)
        kw = {"heads": "gqa", "causal": True, "b": 2, "sq": 129, "sk": 257, "dv": dv, "backward": False}
        out.append(
            _c("func", dtype, d, **kw) if built else _c("func", dtype, d, expect_error=ERR_FEATURE, **kw)
        )
    return out


def error_cases(p: WheelProfile) -> list[Case]:
    """What the wheel was built without must fail cleanly: large head dims, dtypes, backward."""
    cases: list[Case] = []
    dtype = p.dtypes[0]
    d_ok = p.head_dims[0]
    for d in FA3_HEAD_DIMS:
        if d > max(p.head_dims):
            cases.append(_c("func", dtype, d, b=1, sq=64, sk=64, backward=False, expect_error=ERR_HEAD_DIM))
    for dt in ("fp16", "fp8"):
        if dt not in p.dtypes:
            cases.append(_c("func", dt, d_ok, b=1, sq=64, sk=64, backward=False, expect_error=ERR_FEATURE))
    if not p.backward:
        cases.append(
            _c("func", dtype, d_ok, b=1, sq=64, sk=64, expect_error=ERR_FEATURE, expect_error_in="bwd")
        )
    return cases


def fa3_cases(p: WheelProfile, quick: bool = False) -> list[Case]:
    """All FA3 cases for a profile; ``quick`` keeps one head dim per dtype."""
    cases: list[Case] = []
    dims = p.head_dims[:1] if quick else p.head_dims
    for dtype in p.dtypes:
        for d in dims:
            cases.extend(working_cases(p, dtype, d))
    return cases + rounding_cases(p) + v_dim_cases(p) + error_cases(p)
