"""Serving a client's FlexAttention call from the built variants: pick one by shape, pad to its length bucket.

A ``Call`` describes what a client asks for (batch, heads, length, head dim, dtype, device, mask, window,
softcap, scale, whether gradients are needed). ``Server.lookup`` finds the built variant for it: same heads,
head dim, dtype, device, mask, softcap and scale, same batch, and the shortest length that serves it (the exact
length, or a bucket ``pad_from..seq_len``); a call that needs gradients needs a fwd+bwd variant. ``Server.run``
pads q, k, v to the variant's length (causal and sliding-window masks: padded keys come after every real
query, so no real query sees them; the padded queries' outputs are cut off and get no gradient), runs the
variant through ``attention(name)`` (AOTInductor package(s), else its precompiled function, else a compile of
the same mask) and returns the real rows. A call no variant serves gets one log line per distinct shape and
``None``: the client then compiles as usual.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import envkeys
from .artifact_manifest import read_manifest, variants, warn_once
from .loader import attention

log = logging.getLogger("attnforge_flex")
DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


@dataclass(frozen=True)
class Call:
    """One FlexAttention call as a client makes it (``window``: earlier tokens a query sees)."""

    batch: int
    heads_q: int
    heads_kv: int
    seq_len: int
    head_dim: int
    dtype: str
    device: str
    mask: str
    window: int | None = None
    softcap: float | None = None
    scale: float | None = None
    grad: bool = False

    @classmethod
    def of(cls, q: Any, k: Any, v: Any, mask: str, **kw: Any) -> Call:
        """The call for ``(B, H, S, D)`` tensors; ``grad`` when autograd will need their gradients."""
        import torch

        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        b, hq, s, d = (int(x) for x in q.shape)
        return cls(
            b,
            hq,
            int(k.shape[1]),
            s,
            d,
            DTYPE_NAMES.get(str(q.dtype), str(q.dtype)),
            q.device.type,
            mask,
            grad=grad,
            **kw,
        )

    def describe(self) -> str:
        """``B2 S700 H8/2 D64 bf16 cuda causal fwd+bwd`` (+ window, softcap, and scale when not 1/sqrt(D))."""
        scale = None if self.scale is None or math.isclose(self.scale, self.head_dim**-0.5) else self.scale
        extra = "".join(
            f" {k}={v:g}" if isinstance(v, float) else f" {k}={v}"
            for k, v in (("window", self.window), ("softcap", self.softcap), ("scale", scale))
            if v is not None
        )
        return (
            f"B{self.batch} S{self.seq_len} H{self.heads_q}/{self.heads_kv} D{self.head_dim} {self.dtype} "
            f"{self.device} {self.mask}{extra} {'fwd+bwd' if self.grad else 'fwd'}"
        )


def _same_float(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=1e-6)


def _scale(spec: dict[str, Any]) -> float:
    s = spec.get("scale")
    return float(s) if s is not None else float(spec["head_dim"]) ** -0.5


def matches(spec: dict[str, Any], call: Call) -> bool:
    """Whether a variant computes what the call asks for, at some length (lengths are checked separately)."""
    cap = float(spec["softcap"]) if spec.get("score_mod") == "softcap" else None
    if spec.get("score_mod", "none") not in ("none", "softcap"):
        return False
    window = spec.get("window") if spec.get("mask") == "sliding_window" else None
    scale = call.scale if call.scale is not None else call.head_dim**-0.5
    return (
        spec.get("mask") == call.mask
        and window == call.window
        and _same_float(cap, call.softcap)
        and math.isclose(_scale(spec), scale, rel_tol=1e-6)
        and (int(spec.get("batch", 1)), int(spec["heads_q"]), int(spec["heads_kv"]), int(spec["head_dim"]))
        == (call.batch, call.heads_q, call.heads_kv, call.head_dim)
        and spec.get("dtype") == call.dtype
        and spec.get("device", "cuda") == call.device
        and (bool(spec.get("backward")) or not call.grad)
        and not spec.get("dynamic")
    )


def serves_length(spec: dict[str, Any], seq_len: int) -> bool:
    """The variant's length, or a shorter one inside its bucket (``pad_from``)."""
    top = int(spec["seq_len"])
    return int(spec.get("pad_from") or top) <= seq_len <= top


class Server:
    """The built variants of an artifacts folder, served by shape. ``client`` only labels log lines."""

    def __init__(self, artifacts: str | Path | None = None, client: str = "flex") -> None:
        self.artifacts = artifacts
        self.client = client
        self.specs: list[dict[str, Any]] = []
        self.disabled = _unusable(artifacts)  # why nothing is served (warned once), or None
        if self.disabled is None:
            self.specs = [s for s in variants(artifacts).values() if not s.get("dynamic")]
        self._fns: dict[str, Any] = {}
        self._told: set[str] = set()
        # what each call ran (aoti, precompiled, compile, eager, or not served), and served calls per variant
        self.counts: Counter[str] = Counter()
        self.by_variant: Counter[str] = Counter()

    def lookup(self, call: Call) -> tuple[dict[str, Any] | None, str]:
        """The variant serving ``call`` (shortest length), or None and why not."""
        same = [s for s in self.specs if matches(s, call)]
        fits = [s for s in same if serves_length(s, call.seq_len)]
        if fits:
            best = min(fits, key=lambda s: int(s["seq_len"]))
            return best, ""
        if not self.specs:
            return None, "no built variants"
        if not same:
            return None, "no variant with these heads, head dim, batch, dtype, device, mask and scale"
        spans = sorted({(int(s.get("pad_from") or s["seq_len"]), int(s["seq_len"])) for s in same})
        declared = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
        return None, f"length {call.seq_len} is outside the declared lengths ({declared})"

    def tell(self, call: Call, why: str) -> None:
        """One log line per distinct call that is not served."""
        key = call.describe()
        if key not in self._told:
            self._told.add(key)
            log.warning("attnforge_flex: %s: %s not served (%s); compiling as usual", self.client, key, why)

    def run(self, call: Call, q: Any, k: Any, v: Any) -> Any:
        """The attention output ``(B, H, S, D)`` for contiguous-able ``(B, H, S, D)`` inputs, or None (logged)
        when no variant serves the call."""
        if self.disabled is not None:
            self.counts["not served"] += 1
            return None
        spec, why = self.lookup(call)
        if spec is None:
            self.tell(call, why)
            self.counts["not served"] += 1
            return None
        fn = self._fns.get(spec["name"])
        if fn is None:
            fn = self._fns[spec["name"]] = attention(spec["name"], self.artifacts, device=call.device)
        out = run_padded(fn, int(spec["seq_len"]), q, k, v)
        self.counts[str(fn.used)] += 1
        self.by_variant[spec["name"]] += 1
        return out


def run_padded(fn: Any, length: int, q: Any, k: Any, v: Any) -> Any:
    """``fn(q, k, v)`` on ``(B, H, S, D)`` inputs zero-padded along S to ``length`` (made contiguous), cut back
    to S rows. Exact for masks under which a real query never sees a key at position >= S (causal, sliding
    window): the padded keys get no weight, and the padded queries' rows are dropped, so they send no gradient
    to the real keys and values."""
    s = int(q.shape[2])
    if s == length:
        return fn(q.contiguous(), k.contiguous(), v.contiguous())
    import torch.nn.functional as F

    q, k, v = (F.pad(t, (0, 0, 0, length - s)).contiguous() for t in (q, k, v))
    return fn(q, k, v)[:, :, :s]


def _unusable(artifacts: str | Path | None) -> str | None:
    """Why the artifacts cannot serve this process (missing, unreadable, another environment), warned once
    (``FlexCacheWarning``); None when they can."""
    try:
        data = read_manifest(artifacts)
    except (OSError, ValueError) as exc:
        why = f"no usable artifacts ({exc})"
        warn_once(why)
        return why
    diff = envkeys.mismatches(data["env"], envkeys.collect(str(data["env"].get("device", "cuda"))))
    if diff:
        why = "artifacts were built for another environment: " + "; ".join(diff)
        warn_once(why)
        return why
    return None
