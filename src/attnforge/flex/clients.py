"""Flex variants declared from a client's point of view (matrix.yaml ``flex.clients``).

A declaration names the library that calls FlexAttention and describes its attention the way that library
does: a transformers model config (heads, kv-heads, head dim, dtype, causal / sliding-window layers, logit
softcap, query scaling), a diffusers transformer's config (heads and head dim; full attention), or, for a
plain ``torch.compile(flex_attention)`` script, the fields themselves. Lengths are exact (``seq_lens``) or
buckets (``buckets``: each serves the lengths above the previous bucket, padded up to it; causal and sliding
masks only). ``expand()`` gives one variant dict per (attention kind, batch, length), named
``<name>[-<kind>]-b<batch>-s<len>``.

    flex:
      clients:
        - name: llama
          client: transformers
          config: {num_attention_heads: 32, num_key_value_heads: 8, hidden_size: 4096, torch_dtype: bfloat16}
          buckets: [1024, 2048, 4096]
          batches: [1, 4]
          training: true

A ``sliding_window`` of N in a transformers config lets a query see itself and N - 1 earlier tokens: the
variant's ``window`` (earlier tokens seen) is N - 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attnforge.flex.variant import FlexVariant, split_heads

DTYPE_NAMES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
}


def read_config(config: dict[str, Any] | str | None) -> dict[str, Any]:
    """A model config as a dict: given inline, or read from a ``config.json`` path (or its folder)."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return config
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"config {config!r}: cannot read it as a model config.json ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"config {config!r}: not a JSON object")
    return data


def _dtype(value: Any, where: str) -> str:
    name = str(value).replace("torch.", "")
    if name not in DTYPE_NAMES:
        raise ValueError(f"{where}: dtype {value!r} is not one of {sorted(DTYPE_NAMES)}")
    return DTYPE_NAMES[name]


class FlexClient(BaseModel):
    """One client declaration; ``expand()`` turns it into concrete variant dicts."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="prefix of the expanded variant names (lowercase, digits, '-', '_', '.')")
    client: Literal["transformers", "diffusers", "torch"]
    config: dict[str, Any] | str | None = Field(
        None, description="the model's config (inline dict or a config.json path); transformers or diffusers"
    )
    mask: Literal["causal", "sliding_window", "full"] | None = Field(
        None, description="override the mask the config implies (transformers: causal; diffusers: full)"
    )
    window: int | None = Field(None, description="sliding_window: earlier tokens a query sees")
    softcap: float | None = None
    scale: float | None = None
    heads_q: int | None = None
    heads_kv: int | None = None
    head_dim: int | None = None
    dtype: str | None = None
    seq_lens: list[int] = Field(default_factory=list, description="exact lengths served")
    buckets: list[int] = Field(default_factory=list, description="length buckets (padded up to each)")
    batches: list[int] = Field(default_factory=lambda: [1])
    training: bool = Field(False, description="fwd+bwd (training) instead of forward only")
    device: Literal["cuda", "cpu"] = "cuda"
    mode: Literal["default", "max-autotune"] = "default"

    @model_validator(mode="before")
    @classmethod
    def _heads(cls, data: Any) -> Any:
        """Accept ``heads: {q: 32, kv: 8}`` as well as heads_q/heads_kv."""
        return split_heads(data)

    @field_validator("seq_lens", "buckets", "batches")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        bad = [x for x in v if x <= 0]
        if bad:
            raise ValueError(f"values must be positive, got {bad}")
        return sorted(set(v))

    @model_validator(mode="after")
    def _check(self) -> FlexClient:
        if not self.seq_lens and not self.buckets:
            raise ValueError(f"client {self.name}: declare seq_lens or buckets")
        if self.client == "torch" and self.config is not None:
            raise ValueError(
                f"client {self.name}: a torch script has no model config; give heads and head_dim"
            )
        for d in self.expand():
            try:
                FlexVariant.model_validate(d)
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(p) for p in err["loc"])
                raise ValueError(
                    f"client {self.name}: {d['name']}: {loc + ': ' if loc else ''}{err['msg'].removeprefix('Value error, ')}"
                ) from None
        return self

    def attention(self) -> dict[str, Any]:
        """heads_q, heads_kv, head_dim, dtype, softcap and scale, from the config then the explicit fields."""
        cfg = read_config(self.config)
        where = f"client {self.name}"
        out: dict[str, Any] = {}
        if self.client == "transformers":
            hq = cfg.get("num_attention_heads")
            out["heads_q"] = hq
            out["heads_kv"] = cfg.get("num_key_value_heads") or hq
            hd = cfg.get("head_dim")
            if hd is None and hq and cfg.get("hidden_size"):
                hd = int(cfg["hidden_size"]) // int(hq)
            out["head_dim"] = hd
            dt = cfg.get("dtype") or cfg.get("torch_dtype")
            out["dtype"] = _dtype(dt, where) if dt else None
            out["softcap"] = cfg.get("attn_logit_softcapping")
            qs = cfg.get("query_pre_attn_scalar")
            out["scale"] = float(qs) ** -0.5 if qs else None
        elif self.client == "diffusers":
            out["heads_q"] = cfg.get("num_attention_heads")
            out["heads_kv"] = cfg.get("num_key_value_heads") or out["heads_q"]
            out["head_dim"] = cfg.get("attention_head_dim")
        explicit = {
            "heads_q": self.heads_q,
            "heads_kv": self.heads_kv,
            "head_dim": self.head_dim,
            "dtype": _dtype(self.dtype, where) if self.dtype else None,
            "softcap": self.softcap,
            "scale": self.scale,
        }
        out.update({k: v for k, v in explicit.items() if v is not None})
        if out.get("heads_kv") is None:
            out["heads_kv"] = out.get("heads_q")
        missing = [k for k in ("heads_q", "head_dim") if not out.get(k)]
        if missing:
            hint = {
                "transformers": "num_attention_heads / hidden_size or head_dim in the config",
                "diffusers": "num_attention_heads and attention_head_dim in the config",
                "torch": "the fields themselves",
            }[self.client]
            raise ValueError(f"{where}: {', '.join(missing)} unknown: give {hint}")
        for k in ("dtype", "softcap", "scale"):
            out.setdefault(k, None)
        out["dtype"] = out["dtype"] or "bf16"
        return out

    def kinds(self) -> list[tuple[str, str, int | None]]:
        """The attention kinds the model uses, as (name suffix, mask, window)."""
        if self.mask is not None:
            return [("", self.mask, self.window)]
        if self.client != "transformers":
            return [("", "full" if self.client == "diffusers" else "causal", None)]
        cfg = read_config(self.config)
        if cfg.get("is_causal") is False:
            return [("", "full", None)]
        sw = cfg.get("sliding_window")
        types = set(cfg.get("layer_types") or [])
        sliding: tuple[str, str, int | None] | None = (
            ("sliding", "sliding_window", int(sw) - 1) if sw else None
        )
        if types:
            kinds: list[tuple[str, str, int | None]] = []
            if types - {"sliding_attention"} or not sliding:
                kinds.append(("causal", "causal", None))
            if "sliding_attention" in types and sliding:
                kinds.append(sliding)
            return kinds if len(kinds) > 1 else [("", kinds[0][1], kinds[0][2])]
        if sliding and cfg.get("use_sliding_window", True):
            return [("", sliding[1], sliding[2])]
        return [("", "causal", None)]

    def lengths(self) -> list[tuple[int, int]]:
        """(seq_len, pad_from) pairs: exact lengths serve themselves; bucket i serves (bucket i-1, bucket i]."""
        out: dict[int, int] = {s: s for s in self.seq_lens}
        prev = 0
        for b in self.buckets:
            out[b] = min(out.get(b, b), prev + 1)
            prev = b
        return sorted(out.items())

    def expand(self) -> list[dict[str, Any]]:
        """One variant dict per (kind, batch, length)."""
        att = self.attention()
        kinds = self.kinds()
        out = []
        for suffix, mask, window in kinds:
            for batch in self.batches:
                for seq_len, pad_from in self.lengths():
                    name = "-".join(p for p in (self.name, suffix, f"b{batch}", f"s{seq_len}") if p)
                    out.append(
                        {
                            "name": name,
                            "mask": mask,
                            "window": window,
                            "score_mod": "softcap" if att["softcap"] else "none",
                            "softcap": att["softcap"],
                            "dtype": att["dtype"],
                            "head_dim": att["head_dim"],
                            "heads_q": att["heads_q"],
                            "heads_kv": att["heads_kv"],
                            "seq_len": seq_len,
                            "batch": batch,
                            "backward": self.training,
                            "mode": self.mode,
                            "device": self.device,
                            "scale": att["scale"],
                            "pad_from": pad_from,
                            "client": self.client,
                            "group": self.name,
                        }
                    )
        return out
