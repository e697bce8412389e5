"""Pinned names as data (`data/pins.toml`): the CPU stand-in torch and the locally bootstrapped base."""

from __future__ import annotations

import sys
from functools import cache
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@cache
def _pins() -> dict[str, str]:
    text = resources.files("attnforge").joinpath("data/pins.toml").read_text(encoding="utf-8")
    return {k: str(v) for k, v in tomllib.loads(text).items()}


def cpu_torch() -> str:
    """The CPU torch requirement that stands in where torch only has to import (`torch==2.13.0+cpu`)."""
    return _pins()["cpu_torch"]


def local_base() -> str:
    """The Debian base image bootstrapped on machines without a registry (`local/debian:bookworm`)."""
    return _pins()["local_base"]
