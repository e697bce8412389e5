"""The FlexAttention variant spec (matrix.yaml ``flex.variants``): what gets compiled ahead of time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from attnforge.core.errors import ConfigurationError
from attnforge.flex.clients import FlexClient
from attnforge.flex.defaults import DEFAULT_VARIANTS
from attnforge.flex.variant import FlexVariant

__all__ = ["DEFAULT_VARIANTS", "FlexClient", "FlexSection", "FlexVariant", "load_variants", "parse_variants"]


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
