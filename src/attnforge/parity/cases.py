"""The flash-attn parity cases a wheel's profile calls for. Standard library only.

Every built (head dim, dtype) gets the four entry points (``flash_attn_func``, ``flash_attn_qkvpacked_func``,
``flash_attn_varlen_func``, ``flash_attn_with_kvcache`` with and without paged KV), MHA/GQA/MQA, causal and
not, odd sequence lengths, and the features (sliding window, softcap, ALiBi, dropout, a head dim that is not
a multiple of 32). What the profile left out becomes an *expected error* case: the call must raise a
RuntimeError with a clear message, never crash the process.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from attnforge.parity.profile import ALL_DTYPES, ALL_HEAD_DIMS, WheelProfile

HEADS: dict[str, tuple[int, int]] = {"mha": (8, 8), "gqa": (8, 2), "mqa": (8, 1)}
DROPOUT_P = 0.17
WINDOW = (64, 32)
SOFTCAP = 30.0
PAGE = 256

# messages the wheel raises for what it was built without (flash_api.cpp and attnforge's dispatch patch)
ERR_HEAD_DIM = "head dim"
ERR_DTYPE = "dtypes"
ERR_FEATURE = "does not support"


@dataclass(frozen=True)
class Case:
    """One call configuration; ``backward`` adds a gradient check of the same forward call."""

    kernel: str  # func | qkvpacked | varlen | kvcache
    dtype: str
    d: int
    heads: str = "mha"
    b: int = 2
    sq: int = 113
    sk: int = 203
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dropout: float = 0.0
    paged: int = 0  # kvcache page size (0 = contiguous cache)
    backward: bool = True
    expect_error: str | None = None  # substring of the RuntimeError the call must raise
    expect_error_in: str = "fwd"  # fwd | bwd
    skip_bwd: str | None = None  # reason the gradient check is skipped
    impl: str = "fa2"  # fa2 (flash_attn) | fa3 (flash_attn_interface, cases in fa3cases)
    dv: int = 0  # V head dim when it differs from d (FA3's 64 x 256/512, 192 x 128); 0 = d
    splits: int = 1  # FA3 num_splits (0 = its heuristic, > 1 = split-KV)
    append: bool = True  # kvcache: new K/V appended into the cache in the call
    note: str = ""  # what the case shows beyond its name (e.g. a head dim rounded up to a compiled one)

    @property
    def hq(self) -> int:
        return HEADS[self.heads][0]

    @property
    def hk(self) -> int:
        return HEADS[self.heads][1]

    @property
    def features(self) -> list[str]:
        f = [self.heads]
        if self.causal:
            f.append("causal")
        if self.window != (-1, -1):
            f.append(f"window{self.window[0]}_{self.window[1]}")
        if self.softcap:
            f.append(f"softcap{self.softcap:g}")
        if self.alibi:
            f.append("alibi")
        if self.dropout:
            f.append(f"dropout{self.dropout:g}")
        if self.paged:
            f.append(f"paged{self.paged}")
        if self.splits != 1:
            f.append(f"splits{self.splits}" if self.splits else "splits-auto")
        if self.kernel == "kvcache" and not self.append:
            f.append("read-only")
        return f

    @property
    def kernel_name(self) -> str:
        names = {
            "func": "flash_attn_func",
            "qkvpacked": "flash_attn_qkvpacked_func",
            "varlen": "flash_attn_varlen_func",
            "kvcache": "flash_attn_with_kvcache",
        }
        prefix = "fa3." if self.impl == "fa3" else ""
        return f"{prefix}{names[self.kernel]}[{','.join(self.features)}]"

    @property
    def shape(self) -> str:
        dv = f" dv{self.dv}" if self.dv else ""
        return f"b{self.b} sq{self.sq} sk{self.sk} h{self.hq}/{self.hk} d{self.d}{dv}"

    @property
    def id(self) -> str:
        extra = "-expect-error" if self.expect_error else ""
        return f"{self.kernel_name}-{self.dtype}-{self.shape.replace(' ', '_')}{extra}"


def _base(kernel: str, dtype: str, d: int, **kw: object) -> Case:
    return Case(kernel=kernel, dtype=dtype, d=d, **kw)  # type: ignore[arg-type]


def uneven_dim(d: int) -> int | None:
    """A head dim that lands in bucket ``d`` but is not a multiple of 32 (exercises the uneven-K path)."""
    prev = [x for x in ALL_HEAD_DIMS if x < d]
    cand = d - 8
    if cand % 32 == 0 or (prev and cand <= prev[-1]):
        return None
    return cand


def working_cases(profile: WheelProfile, dtype: str, d: int) -> list[Case]:
    """Cases that must compute the right answer for a built (dtype, head dim)."""
    cases: list[Case] = []
    for heads in HEADS:
        for causal in (False, True):
            cases.append(_base("func", dtype, d, heads=heads, causal=causal, b=2, sq=113, sk=203))
            cases.append(_base("func", dtype, d, heads=heads, causal=causal, b=1, sq=1023, sk=1024))
    feat = {"heads": "gqa", "b": 2, "sq": 257, "sk": 511}
    for causal in (False, True):
        cases.append(_base("func", dtype, d, causal=causal, window=WINDOW, **feat))
        cases.append(_base("func", dtype, d, causal=causal, softcap=SOFTCAP, **feat))
        cases.append(_base("func", dtype, d, causal=causal, alibi=True, **feat))
        cases.append(
            _base("func", dtype, d, causal=causal, dropout=DROPOUT_P, heads="mha", b=2, sq=257, sk=511)
        )
        cases.append(_base("qkvpacked", dtype, d, causal=causal, heads="mha", b=2, sq=257, sk=257))
        cases.append(_base("varlen", dtype, d, causal=causal, heads="gqa", b=3, sq=301, sk=433))
    cases.append(_base("varlen", dtype, d, causal=True, window=WINDOW, heads="gqa", b=3, sq=301, sk=433))
    cases.append(_base("varlen", dtype, d, softcap=SOFTCAP, heads="mqa", b=3, sq=301, sk=433))
    ud = uneven_dim(d)
    if ud is not None:
        cases.append(_base("func", dtype, ud, causal=True, heads="mha", b=2, sq=129, sk=129))
    for paged in (0, PAGE):
        cases.append(_base("kvcache", dtype, d, heads="gqa", causal=True, b=3, sq=1, sk=777, paged=paged))
        cases.append(_base("kvcache", dtype, d, heads="mqa", causal=True, b=2, sq=64, sk=1031, paged=paged))
    out = []
    for c in cases:
        if c.kernel == "kvcache":
            c = replace(c, backward=False)
        out.append(_gate(profile, c))
    return out


def _gate(profile: WheelProfile, c: Case) -> Case:
    """Turn a case that needs a disabled feature into an expected-error case; mark skipped backward."""
    needs = []
    if c.dropout:
        needs.append("dropout")
    if c.alibi:
        needs.append("alibi")
    if c.softcap:
        needs.append("softcap")
    if c.window != (-1, -1):
        needs.append("local")
    if c.d % 32:
        needs.append("uneven_k")
    missing = [f for f in needs if not profile.has(f)]
    if missing:
        return replace(c, expect_error=ERR_FEATURE, backward=False)
    if c.backward and not profile.backward:
        return replace(c, skip_bwd=f"profile '{profile.name}' was built without backward")
    return c


def error_cases(profile: WheelProfile) -> list[Case]:
    """What the wheel was built without must fail cleanly: head dims, dtypes, backward."""
    cases: list[Case] = []
    dtype = profile.dtypes[0]
    d_ok = profile.head_dims[0]
    for d in ALL_HEAD_DIMS:
        if d not in profile.head_dims:
            cases.append(
                _base("func", dtype, d, b=1, sq=64, sk=64, backward=False, expect_error=ERR_HEAD_DIM)
            )
    for dt in ALL_DTYPES:
        if dt not in profile.dtypes:
            cases.append(_base("func", dt, d_ok, b=1, sq=64, sk=64, backward=False, expect_error=ERR_DTYPE))
    if not profile.backward:
        cases.append(
            _base("func", dtype, d_ok, b=1, sq=64, sk=64, expect_error=ERR_FEATURE, expect_error_in="bwd")
        )
    return cases


def flash_cases(profile: WheelProfile, quick: bool = False) -> list[Case]:
    """All flash-attn cases for a profile; ``quick`` keeps one head dim per dtype (smoke runs)."""
    cases: list[Case] = []
    dims = profile.head_dims[:1] if quick else profile.head_dims
    for dtype in profile.dtypes:
        for d in dims:
            cases.extend(working_cases(profile, dtype, d))
    return cases + error_cases(profile)
