"""Kernel-level facts named once (`data/kernels.json`): import names, head dims, dtypes and the features a
profile can compile out, per kernel. Standard library only (the parity suite reads it on GPU hosts)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

KERNELS = ("flash-attn", "flash-attn-3")


@cache
def _data() -> dict[str, Any]:
    text = resources.files("attnforge").joinpath("data/kernels.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def facts(kernel: str) -> dict[str, Any]:
    """One kernel's facts; KeyError names the kernels known."""
    data = _data()
    if kernel not in KERNELS:
        raise KeyError(f"unknown kernel {kernel!r} (known: {', '.join(KERNELS)})")
    row: dict[str, Any] = data[kernel]
    return row


def head_dims(kernel: str = "flash-attn") -> tuple[int, ...]:
    return tuple(int(d) for d in facts(kernel)["head_dims"])


def dtypes(kernel: str = "flash-attn") -> tuple[str, ...]:
    return tuple(facts(kernel)["dtypes"])


def features(kernel: str = "flash-attn") -> tuple[str, ...]:
    return tuple(facts(kernel)["features"])


def import_names(kernel: str) -> list[str]:
    return list(facts(kernel)["import_names"])


def modules(kernel: str) -> dict[str, str]:
    """What an image's smoke test imports for a kernel: distribution, compiled extension, API module."""
    f = facts(kernel)
    return {"dist": str(f["dist"]), "extension": str(f["extension"]), "api": str(f["api"])}


def all_features() -> tuple[str, ...]:
    """Every feature name any kernel's profile may disable (the schema's vocabulary)."""
    return tuple(dict.fromkeys(f for k in KERNELS for f in features(k)))
