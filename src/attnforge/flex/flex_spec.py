"""The FlexAttention variant spec (matrix.yaml ``flex.variants``): what gets compiled ahead of time."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attnforge.core.errors import ConfigurationError
from attnforge.flex.clients import FlexClient, split_heads
from attnforge.flex.defaults import DEFAULT_VARIANTS

__all__ = ["DEFAULT_VARIANTS", "FlexClient", "FlexSection", "FlexVariant", "load_variants", "parse_variants"]


class FlexVariant(BaseModel):
    """One FlexAttention call to compile: mask, score_mod, dtype, shape, and how to compile it."""

    model_config = ConfigDict(extra="forbid")

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


class FlexSection(BaseModel):
    """matrix.yaml ``flex``: the variants to build, given directly (``variants``) or declared from a client's
    point of view (``clients``: a model config, lengths or length buckets, batch sizes; flex/clients.py)."""

    model_config = ConfigDict(extra="forbid")

    variants: list[FlexVariant] = Field(default_factory=list)
    clients: list[FlexClient] = Field(default_factory=list)

    def all_variants(self) -> list[FlexVariant]:
        """The given variants followed by every client declaration's expansion."""
        out = list(self.variants)
        for c in self.clients:
            out.extend(FlexVariant.model_validate(d) for d in c.expand())
        return out

    @model_validator(mode="after")
    def _unique(self) -> FlexSection:
        seen: set[str] = set()
        for v in self.all_variants():
            if v.name in seen:
                raise ValueError(f"flex variant name {v.name!r} appears twice")
            seen.add(v.name)
        return self


def parse_variants(data: Any, where: str = "flex") -> list[FlexVariant]:
    """Variants from ``{"flex": {"variants": [...], "clients": [...]}}``, ``{"variants": [...]}`` or a bare
    list; client declarations are expanded into one variant per (attention kind, batch, length)."""
    if isinstance(data, dict) and "flex" in data:
        data = data["flex"]
    if isinstance(data, list):
        data = {"variants": data}
    try:
        return FlexSection.model_validate(data or {}).all_variants()
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ConfigurationError(f"{where}: {loc}: {err['msg'].removeprefix('Value error, ')}") from None


def load_variants(path: Path) -> list[FlexVariant]:
    """Read variants from a YAML or JSON file (matrix.yaml works: its ``flex`` section is used)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"cannot read {path}: {exc}") from None
    return parse_variants(data, str(path))
