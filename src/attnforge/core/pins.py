"""Pinned names as data (`data/pins.toml`): the CPU stand-in torch, the locally bootstrapped base and the
local CUDA stand-in bases."""

from __future__ import annotations

import sys
from functools import cache
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@cache
def _pins() -> dict[str, Any]:
    text = resources.files("attnforge").joinpath("data/pins.toml").read_text(encoding="utf-8")
    data: dict[str, Any] = tomllib.loads(text)
    return data


def cpu_torch() -> str:
    """The CPU torch requirement that stands in where torch only has to import (`torch==2.13.0+cpu`)."""
    return str(_pins()["cpu_torch"])


def local_base() -> str:
    """The Debian base image bootstrapped on machines without a registry (`local/debian:bookworm`)."""
    return str(_pins()["local_base"])


def cuda_standins() -> dict[str, dict[str, Any]]:
    """The CUDA stand-in bases by CUDA version ("12.4" -> tag, cuda_full, stands_in_for, suite, debs)."""
    return dict(_pins().get("cuda_standin", {}))
