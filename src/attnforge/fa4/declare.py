"""FlashAttention-4 calls declared ahead of time: what ``attnforge fa4 build`` compiles (standard library only).

A declaration names one FA4 call the way a caller makes it: head dim (and V head dim), dtype, causal or not,
query and key/value heads (the GQA ratio), varlen or dense, forward or forward+backward, and the batch and
lengths it is compiled at. FA4's compile key holds the dtype, head dims, heads-per-KV-head, causal, varlen and
the tile and scheduling choices FA4 derives from the shape, not the lengths themselves: a call at another
length that makes the same choices finds the same kernel (docs/fa4.md).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnforge.matrix.fa4_cells import DTYPES, HEAD_DIMS  # FA4's Hopper path; others are refused

_FIELDS = {
    "name",
    "head_dim",
    "head_dim_v",
    "dtype",
    "causal",
    "heads_q",
    "heads_kv",
    "batch",
    "seq_lens",
    "varlen",
    "training",
}


class DeclarationError(ValueError):
    """A declaration that FA4 cannot be compiled for, naming the declaration and the field."""


@dataclass(frozen=True)
class Declaration:
    """One FA4 call compiled ahead of time."""

    name: str
    head_dim: int = 128
    head_dim_v: int | None = None
    dtype: str = "bf16"
    causal: bool = True
    heads_q: int = 16
    heads_kv: int = 16
    batch: int = 2
    seq_lens: tuple[int, ...] = (2048,)
    varlen: bool = False
    training: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def dv(self) -> int:
        """The V head dim (the Q/K head dim unless declared)."""
        return self.head_dim_v if self.head_dim_v is not None else self.head_dim

    @property
    def gqa_ratio(self) -> int:
        """Query heads per key/value head."""
        return self.heads_q // self.heads_kv

    def describe(self) -> str:
        """``D128 bf16 causal H32/8 B2 S2048 fwd+bwd`` (varlen marked)."""
        lens = ",".join(str(s) for s in self.seq_lens)
        return (
            f"D{self.head_dim}{'/' + str(self.dv) if self.dv != self.head_dim else ''} {self.dtype} "
            f"{'causal' if self.causal else 'full'} H{self.heads_q}/{self.heads_kv} B{self.batch} S{lens}"
            f"{' varlen' if self.varlen else ''} {'fwd+bwd' if self.training else 'fwd'}"
        )

    def to_json(self) -> dict[str, Any]:
        """The declaration as plain JSON (lists for tuples)."""
        d = asdict(self)
        d.pop("extra")
        d["seq_lens"] = list(self.seq_lens)
        return d


def _int(name: str, raw: dict[str, Any], key: str, default: int | None) -> int | None:
    v = raw.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise DeclarationError(f"fa4 declaration {name!r}: {key} must be a positive integer, not {v!r}")
    return v


def _bool(name: str, raw: dict[str, Any], key: str, default: bool) -> bool:
    v = raw.get(key, default)
    if not isinstance(v, bool):
        raise DeclarationError(f"fa4 declaration {name!r}: {key} must be true or false, not {v!r}")
    return v


def parse(raw: dict[str, Any]) -> Declaration:
    """One declaration from a dict; ``DeclarationError`` naming the declaration and the field when it is wrong."""
    if not isinstance(raw, dict):
        raise DeclarationError(f"fa4 declaration must be a mapping, not {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_." for c in name):
        raise DeclarationError(f"fa4 declaration name must be letters, digits, '-', '_' or '.', not {name!r}")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise DeclarationError(f"fa4 declaration {name!r}: unknown field(s) {', '.join(unknown)}")
    head_dim = _int(name, raw, "head_dim", 128)
    head_dim_v = _int(name, raw, "head_dim_v", None)
    assert head_dim is not None
    for key, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d is not None and d not in HEAD_DIMS:
            raise DeclarationError(
                f"fa4 declaration {name!r}: {key} {d} is not one FA4 compiles on Hopper "
                f"({', '.join(map(str, HEAD_DIMS))})"
            )
    dtype = raw.get("dtype", "bf16")
    if dtype not in DTYPES:
        raise DeclarationError(
            f"fa4 declaration {name!r}: dtype must be one of {', '.join(DTYPES)}, not {dtype!r}"
        )
    heads_q = _int(name, raw, "heads_q", 16)
    heads_kv = _int(name, raw, "heads_kv", heads_q)
    assert heads_q is not None and heads_kv is not None
    if heads_q % heads_kv:
        raise DeclarationError(
            f"fa4 declaration {name!r}: heads_q {heads_q} is not a multiple of heads_kv {heads_kv}"
        )
    batch = _int(name, raw, "batch", 2)
    assert batch is not None
    lens = raw.get("seq_lens", [2048])
    if not isinstance(lens, list) or not lens:
        raise DeclarationError(f"fa4 declaration {name!r}: seq_lens must be a non-empty list, not {lens!r}")
    seq_lens = tuple(_int(name, {"seq_lens": s}, "seq_lens", None) or 0 for s in lens)
    return Declaration(
        name=name,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        dtype=dtype,
        causal=_bool(name, raw, "causal", True),
        heads_q=heads_q,
        heads_kv=heads_kv,
        batch=batch,
        seq_lens=seq_lens,
        varlen=_bool(name, raw, "varlen", False),
        training=_bool(name, raw, "training", True),
    )


def parse_all(items: Any, origin: str = "declarations") -> list[Declaration]:
    """A list of declarations with unique names."""
    if not isinstance(items, list) or not items:
        raise DeclarationError(f"{origin}: expected a non-empty list of fa4 declarations")
    out = [parse(x) for x in items]
    seen: set[str] = set()
    for d in out:
        if d.name in seen:
            raise DeclarationError(f"{origin}: fa4 declaration name {d.name!r} is used twice")
        seen.add(d.name)
    return out


def load(path: Path) -> list[Declaration]:
    """Declarations from a JSON file (a list, or ``{"declarations": [...]}``)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DeclarationError(f"{path}: cannot read fa4 declarations: {exc}") from None
    if isinstance(data, dict):
        data = data.get("declarations")
    return parse_all(data, str(path))


# What `attnforge fa4 build --defaults` compiles: a Llama-style GQA training step, an MHA causal forward
# (inference), a head-dim-64 fp16 bidirectional step and a packed (varlen) causal forward.
DEFAULTS: list[dict[str, Any]] = [
    {
        "name": "gqa-causal-bf16",
        "head_dim": 128,
        "dtype": "bf16",
        "causal": True,
        "heads_q": 32,
        "heads_kv": 8,
        "batch": 2,
        "seq_lens": [2048],
        "training": True,
    },
    {
        "name": "mha-causal-bf16-fwd",
        "head_dim": 128,
        "dtype": "bf16",
        "causal": True,
        "heads_q": 16,
        "heads_kv": 16,
        "batch": 4,
        "seq_lens": [2048],
        "training": False,
    },
    {
        "name": "mha-full-fp16-d64",
        "head_dim": 64,
        "dtype": "fp16",
        "causal": False,
        "heads_q": 16,
        "heads_kv": 16,
        "batch": 4,
        "seq_lens": [1024],
        "training": True,
    },
    {
        "name": "varlen-causal-bf16-fwd",
        "head_dim": 128,
        "dtype": "bf16",
        "causal": True,
        "heads_q": 16,
        "heads_kv": 16,
        "batch": 4,
        "seq_lens": [1024],
        "varlen": True,
        "training": False,
    },
]
