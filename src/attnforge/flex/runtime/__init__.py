"""Ahead-of-time compiled FlexAttention kernels: serve them to the libraries that call FlexAttention.

In the ``attnforge-flex-kernels`` wheel this package is ``attnforge_flex``; in attnforge's sources it is
``attnforge.flex.runtime``. Importing it never imports torch and never raises.

    import attnforge_flex
    attnforge_flex.enable()     # transformers' flex_attention, diffusers' flex backend: the built variants
    flex = attnforge_flex.flex_attention           # a plain script's torch.compile(flex_attention), served
    attnforge_flex.load()                          # or: Mega-Cache artifacts -> Inductor's caches
    attn = attnforge_flex.attention("causal-bf16") # one variant by name, at its built shape

When the environment differs from the one the artifacts were built in (torch, Triton, CUDA, GPU capability,
Python), a file is corrupted, or the artifacts are missing, ``load()`` warns once (``FlexCacheWarning``) and
loads nothing: compilation then happens as it would without this package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import client_diffusers, client_transformers
from .artifact_manifest import ARTIFACTS, MANIFEST, FlexCacheWarning, read_manifest, variants, warn_once
from .loader import LoadResult, TrainPackages, aoti, attention, load, load_package, precompiled_function

__all__ = [
    "ARTIFACTS",
    "CLIENTS",
    "MANIFEST",
    "FlexCacheWarning",
    "LoadResult",
    "TrainPackages",
    "aoti",
    "attention",
    "enable",
    "flex_attention",
    "load",
    "load_package",
    "precompiled_function",
    "read_manifest",
    "stats",
    "variants",
]

CLIENTS = ("transformers", "diffusers", "torch")


def enable(
    clients: tuple[str, ...] | list[str] = CLIENTS,
    artifacts: str | Path | None = None,
    override_flex: bool = True,
) -> dict[str, Any]:
    """Serve the built variants to each named client that is installed: transformers (``attnforge_flex`` and,
    with ``override_flex``, ``flex_attention`` in its attention registry), diffusers (its ``flex`` attention
    backend) and plain scripts (``flex_attention`` of this package). Returns client -> its ``Server``, or why
    it was skipped. A stale environment, broken artifacts or a client version without the registry this
    needs warn once; the clients then compile as usual."""
    import importlib.util

    out: dict[str, Any] = {}
    for client in clients:
        if client not in CLIENTS:
            raise ValueError(f"enable(): unknown client {client!r} (one of {', '.join(CLIENTS)})")
        if client != "torch" and importlib.util.find_spec(client) is None:
            out[client] = f"{client} is not installed"
            continue
        try:
            out[client] = _enable_one(client, artifacts, override_flex)
        except Exception as exc:  # a client version without the registry this needs: that client compiles
            out[client] = f"not enabled: {type(exc).__name__}: {exc}"
            warn_once(f"{client}: {out[client]}")
    return out


def _enable_one(client: str, artifacts: str | Path | None, override_flex: bool) -> Any:
    """Enable one client; returns its ``Server``."""
    if client == "transformers":
        return client_transformers.enable(artifacts, override_flex=override_flex)
    if client == "diffusers":
        return client_diffusers.enable(artifacts)
    from . import client_torch  # optional: torch

    return client_torch.enable(artifacts)


def flex_attention(*args: Any, **kwargs: Any) -> Any:
    """``torch.compile(flex_attention)`` for a plain script, served from the built variants where they fit
    (``client_torch``; call ``enable()`` first, else every call compiles)."""
    from . import client_torch  # optional: torch

    return client_torch.flex_attention(*args, **kwargs)


def stats() -> dict[str, dict[str, Any]]:
    """Per enabled client, how many calls ran what so far (aoti, precompiled, compile, eager, not served)
    and, under ``variants``, how many calls each variant served."""
    import sys

    out: dict[str, dict[str, Any]] = {}
    for client in CLIENTS:
        mod = sys.modules.get(f"{__name__}.client_{client}")
        server = getattr(mod, "_server", None)
        if server is not None:
            out[client] = {**server.counts, "variants": dict(server.by_variant)}
    return out
