"""attnforge's kernels behind diffusers' attention dispatcher (its ``flex`` backend).

``enable()`` re-registers diffusers' ``AttentionBackendName.FLEX`` with this module's function (diffusers'
own checks kept), so whatever selects that backend (``attention_backend("flex")``,
``model.set_attention_backend("flex")``, ``DIFFUSERS_ATTN_BACKEND=flex``, SimpleTuner's
``--attention_mechanism=flex``) runs the built variants. A call without an attention mask (full attention, or
causal with ``is_causal``) goes to the ``Server``; one it does not serve is compiled
(``torch.compile(flex_attention)``, the normal compile; so is cross-attention, whose query and key lengths
differ). Calls with a mask, ``return_lse`` or context parallelism, and calls under ``torch.compile``, go to
diffusers' own flex function unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .server import Call, Server

_server: Server | None = None
_stock: Any = None  # diffusers' own flex backend function
_compiled: Any = None
_block_masks: dict[tuple[int, str], Any] = {}


def enable(artifacts: str | Path | None = None) -> Server:
    """Put ``flex_backend`` behind diffusers' ``flex`` backend; returns the ``Server``."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    global _server, _stock
    reg = _AttentionBackendRegistry
    if _stock is None:
        _stock = reg._backends[AttentionBackendName.FLEX]
    _server = Server(artifacts, client="diffusers")
    reg.register(
        AttentionBackendName.FLEX, constraints=list(reg._constraints.get(AttentionBackendName.FLEX, []))
    )(flex_backend)
    return _server


def disable() -> None:
    """Give diffusers' ``flex`` backend its own function back."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    global _server
    if _stock is not None:
        reg = _AttentionBackendRegistry
        reg.register(
            AttentionBackendName.FLEX, constraints=list(reg._constraints.get(AttentionBackendName.FLEX, []))
        )(_stock)
    _server = None


def _compile(q: Any, k: Any, v: Any, causal: bool, scale: float | None) -> Any:
    """The normal compile: ``torch.compile(flex_attention)`` with a causal block mask or none."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    global _compiled
    if _compiled is None:
        _compiled = torch.compile(flex_attention)
    bm = None
    if causal:
        s = int(q.shape[2])
        key = (s, str(q.device))
        if key not in _block_masks:

            def causal_mask(b: Any, h: Any, qi: Any, kv: Any) -> Any:
                return qi >= kv

            _block_masks[key] = create_block_mask(causal_mask, None, None, s, s, device=q.device)
        bm = _block_masks[key]
    return _compiled(q, k, v, block_mask=bm, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def flex_backend(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    _parallel_config: Any = None,
) -> Any:
    """diffusers' backend signature: ``(B, S, H, D)`` in and out."""
    import torch

    plain = attn_mask is None and not return_lse and _parallel_config is None
    if not plain or _server is None or torch.compiler.is_compiling():
        return _stock(
            query,
            key,
            value,
            attn_mask=attn_mask,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
            return_lse=return_lse,
            _parallel_config=_parallel_config,
        )
    q, k, v = (t.permute(0, 2, 1, 3) for t in (query, key, value))
    call = Call.of(q, k, v, "causal" if is_causal else "full", scale=scale)
    if q.shape[2] == k.shape[2]:
        out = _server.run(call, q, k, v)
    else:
        out = None
        _server.tell(call, f"cross-attention over {int(k.shape[2])} keys")
        _server.counts["not served"] += 1
    if out is None:
        out = _compile(q, k, v, bool(is_causal), scale)
    return out.permute(0, 2, 1, 3)
