"""One FlexAttention variant (matrix.yaml ``flex.variants`` item): mask, score_mod, dtype, shape and how to
compile it, validated."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def split_heads(data: Any) -> Any:
    """A declaration's ``heads: {q: 32, kv: 8}`` as ``heads_q``/``heads_kv`` (kv defaults to q)."""
    if isinstance(data, dict) and isinstance(data.get("heads"), dict):
        data = dict(data)
        heads = data.pop("heads")
        data.setdefault("heads_q", heads.get("q"))
        data.setdefault("heads_kv", heads.get("kv", heads.get("q")))
    return data


class FlexVariant(BaseModel):
    """One FlexAttention call to compile: mask, score_mod, dtype, shape, and how to compile it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="file-safe name: lowercase letters, digits, '-', '_', '.'")
    mask: Literal["causal", "sliding_window", "document", "prefix_lm", "full"] = "causal"
    window: int | None = Field(None, description="sliding_window: how many earlier tokens a query sees")
    prefix: int | None = Field(None, description="prefix_lm: length of the bidirectional prefix")
    score_mod: Literal["none", "alibi", "softcap"] = "none"
    softcap: float | None = Field(None, description="softcap: the cap value (e.g. 30 or 50)")
    dtype: str = Field("bf16", description="bf16 | fp16 (fp32 is refused)")
    head_dim: int = 128
    heads_q: int = 16
    heads_kv: int = 16
    seq_len: int = 2048
    batch: int = 1
    dynamic: bool = False
    backward: bool = True
    mode: Literal["default", "max-autotune"] = "default"
    device: Literal["cuda", "cpu"] = "cuda"
    scale: float | None = Field(None, description="softmax scale (None: 1/sqrt(head_dim))")
    pad_from: int | None = Field(
        None,
        description="a length bucket: calls of pad_from..seq_len tokens are served by padding to seq_len "
        "(causal and sliding_window masks only: padded keys are then invisible to every real query)",
    )
    client: Literal["transformers", "diffusers", "torch"] | None = Field(
        None, description="the library whose calls this variant serves (set by a `flex.clients` declaration)"
    )
    group: str | None = Field(
        None, description="the `flex.clients` declaration this variant was expanded from"
    )

    @model_validator(mode="before")
    @classmethod
    def _heads(cls, data: Any) -> Any:
        """Accept ``heads: {q: 32, kv: 8}`` as well as heads_q/heads_kv."""
        return split_heads(data)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        ok = v and v[0].isalnum() and all(c.isalnum() or c in "-_." for c in v) and v.lower() == v
        if not ok:
            raise ValueError(f"variant name {v!r}: use lowercase letters, digits, '-', '_' and '.'")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v in ("fp32", "float32", "float"):
            raise ValueError(
                "dtype fp32 is not supported: FlexAttention kernels are built for bf16 or fp16 "
                "(fp32 runs, but there is nothing to gain from shipping its compiled kernels)"
            )
        if v not in ("bf16", "fp16"):
            raise ValueError(f"dtype {v!r}: use bf16 or fp16")
        return v

    @field_validator("head_dim")
    @classmethod
    def _head_dim(cls, v: int) -> int:
        if v <= 0 or v % 8 or v > 256:
            raise ValueError(f"head_dim {v}: a multiple of 8 up to 256")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> FlexVariant:
        if self.mask == "sliding_window" and (self.window is None or self.window <= 0):
            raise ValueError(f"variant {self.name}: mask sliding_window needs window > 0")
        if self.mask == "prefix_lm" and (self.prefix is None or not 0 < self.prefix <= self.seq_len):
            raise ValueError(f"variant {self.name}: mask prefix_lm needs 0 < prefix <= seq_len")
        if self.mask == "document" and self.seq_len < 8:
            raise ValueError(f"variant {self.name}: mask document needs seq_len >= 8")
        if self.score_mod == "softcap" and (self.softcap is None or self.softcap <= 0):
            raise ValueError(f"variant {self.name}: score_mod softcap needs softcap > 0")
        if min(self.heads_q, self.heads_kv, self.seq_len, self.batch) <= 0:
            raise ValueError(f"variant {self.name}: heads, seq_len and batch must be positive")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"variant {self.name}: heads_q {self.heads_q} is not a multiple of heads_kv {self.heads_kv}"
            )
        if self.pad_from is not None:
            if not 1 <= self.pad_from <= self.seq_len:
                raise ValueError(
                    f"variant {self.name}: pad_from {self.pad_from} must be in 1..seq_len {self.seq_len}"
                )
            if self.pad_from < self.seq_len and self.mask not in ("causal", "sliding_window"):
                raise ValueError(
                    f"variant {self.name}: length buckets (pad_from < seq_len) need a causal or sliding_window "
                    f"mask; with mask {self.mask!r} padded keys would be attended to"
                )
        if self.scale is not None and self.scale <= 0:
            raise ValueError(f"variant {self.name}: scale must be > 0")
        if self.device == "cpu" and self.backward:
            raise ValueError(
                f"variant {self.name}: FlexAttention has no backward on CPU; set backward: false for device cpu"
            )
        return self

    def as_dict(self) -> dict[str, Any]:
        """The plain dict the builder, the worker and attnforge_flex read."""
        return self.model_dump()
