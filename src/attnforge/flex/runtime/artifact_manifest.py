"""The artifacts folder and its manifest, and the one-time warning when they are not used: what the loader
(``loader``) and the client servers (``server``) share."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
MANIFEST = "manifest.json"
_warned: set[str] = set()


class FlexCacheWarning(UserWarning):
    """The prebuilt FlexAttention artifacts were not used (the reason is in the message)."""


def warn_once(message: str) -> None:
    """Warn (``FlexCacheWarning``) the first time a reason comes up, once per process."""
    if message in _warned:
        return
    _warned.add(message)
    warnings.warn(
        f"attnforge_flex: {message}; falling back to normal compilation", FlexCacheWarning, stacklevel=3
    )


def read_manifest(artifacts: str | Path | None = None) -> dict[str, Any]:
    """The artifacts' manifest (raises OSError/ValueError when missing or unreadable)."""
    path = base_dir(artifacts) / MANIFEST
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "variants" not in data or "env" not in data:
        raise ValueError(f"{path}: not an attnforge-flex manifest")
    return data


def base_dir(artifacts: str | Path | None) -> Path:
    return Path(artifacts) if artifacts else ARTIFACTS


def variants(artifacts: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Variant name -> its spec dict ({} when there are no readable artifacts)."""
    try:
        data = read_manifest(artifacts)
    except (OSError, ValueError):
        return {}
    return {v["name"]: v["spec"] for v in data["variants"]}
