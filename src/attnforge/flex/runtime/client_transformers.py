"""attnforge's kernels behind Hugging Face transformers' attention registry (transformers >= 5).

``enable()`` registers an attention function and a mask function under ``attnforge_flex`` and, by default,
under ``flex_attention`` too, so ``attn_implementation="flex_attention"`` (or ``"attnforge_flex"``) runs the
built variants. The mask function returns None where the mask is a plain causal, sliding-window or
bidirectional one over the whole sequence (no padding, no cache offset, no packed sequences), as
transformers' own SDPA mask does; the attention function then derives the mask kind the way transformers'
SDPA path does (``is_causal`` from the call or the module, ``sliding_window`` from the call) and asks the
``Server``. Anything else (a padding mask, decoding with a cache, attention sinks, a position bias,
dropout, a call under ``torch.compile``) and every call no variant serves goes to transformers' own
``flex_attention_forward`` with the block mask transformers would have built: a normal compile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .server import Call, Server

NAME = "attnforge_flex"
_server: Server | None = None
_block_masks: dict[tuple[Any, ...], Any] = {}


def enable(artifacts: str | Path | None = None, *, override_flex: bool = True) -> Server:
    """Register with transformers (``attnforge_flex``, and ``flex_attention`` when ``override_flex``);
    returns the ``Server`` whose ``counts`` say what the calls ran."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    global _server
    _server = Server(artifacts, client="transformers")
    for name in (NAME, "flex_attention") if override_flex else (NAME,):
        AttentionInterface.register(name, attention_forward)
        AttentionMaskInterface.register(name, mask)
    return _server


def disable() -> None:
    """Put transformers' own flex_attention functions back; ``attnforge_flex`` then runs them too."""
    from transformers import AttentionInterface
    from transformers.integrations.flex_attention import flex_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, flex_attention_mask

    global _server
    _server = None
    for name in (NAME, "flex_attention"):
        AttentionInterface.register(name, flex_attention_forward)
        AttentionMaskInterface.register(name, flex_attention_mask)


def _compiling() -> bool:
    import torch

    return bool(torch.compiler.is_compiling())


def plain(
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    attention_mask: Any = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
) -> bool:
    """Whether transformers asks for a plain mask over the whole sequence: skippable (no packed sequences,
    no overlay), no cache offset, as many queries as keys, no padding, not under ``torch.compile``."""
    return (
        _server is not None
        and _server.disabled is None
        and (allow_is_causal_skip or allow_is_bidirectional_skip)
        and isinstance(q_offset, int)
        and isinstance(kv_offset, int)
        and q_offset == 0 == kv_offset
        and q_length == kv_length
        and not _compiling()
        and (attention_mask is None or bool(attention_mask[:, :kv_length].all()))
    )


def mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Any = None,
    attention_mask: Any = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    **kwargs: Any,
) -> Any:
    """None for a ``plain`` mask (what the attention function serves), else transformers' own flex block
    mask."""
    from transformers.masking_utils import causal_mask_function, flex_attention_mask

    if plain(
        q_length,
        kv_length,
        q_offset,
        kv_offset,
        attention_mask,
        allow_is_causal_skip,
        allow_is_bidirectional_skip,
    ):
        return None
    return flex_attention_mask(
        batch_size,
        q_length,
        kv_length,
        q_offset,
        kv_offset,
        mask_function=mask_function or causal_mask_function,
        attention_mask=attention_mask,
        **kwargs,
    )


def _kind(module: Any, q_len: int, kwargs: dict[str, Any]) -> tuple[str, int | None]:
    """(mask, window) for a call whose mask was skipped, as transformers' SDPA path reads it."""
    sw = kwargs.get("sliding_window")
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if not (is_causal and q_len > 1):
        return "full", None
    if sw:
        return "sliding_window", int(sw) - 1  # transformers: a query sees itself and sw - 1 earlier tokens
    return "causal", None


def _block_mask(kind: str, window: int | None, batch: int, seq_len: int, device: Any) -> Any:
    """The block mask transformers would have built for a plain mask (kept per shape)."""
    from transformers import masking_utils as mu

    key = (kind, window, batch, seq_len, str(device))
    if key not in _block_masks:
        fn: Any = {"causal": mu.causal_mask_function, "full": mu.bidirectional_mask_function}.get(kind)
        if kind == "sliding_window":
            fn = mu.sliding_window_causal_mask_function(int(window or 0) + 1)
        if len(_block_masks) >= 16:
            _block_masks.pop(next(iter(_block_masks)))
        _block_masks[key] = mu.flex_attention_mask(batch, seq_len, seq_len, mask_function=fn, device=device)
    return _block_masks[key]


def attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """transformers' attention-function signature: ``(B, H, S, D)`` in, ``((B, S, H, D), None)`` out."""
    from transformers.integrations.flex_attention import flex_attention_forward

    special = (
        kwargs.get("s_aux") is not None
        or kwargs.get("position_bias") is not None
        or float(kwargs.get("dropout") or 0.0) > 0
    )
    if attention_mask is None and query.shape[2] == key.shape[2]:  # our mask function skipped a plain mask
        kind, window = _kind(module, int(query.shape[2]), kwargs)
        if not special and _server is not None and not _compiling():
            call = Call.of(query, key, value, kind, window=window, softcap=softcap, scale=scaling)
            out = _server.run(call, query, key, value)
            if out is not None:
                return out.transpose(1, 2).contiguous(), None
        attention_mask = _block_mask(kind, window, int(query.shape[0]), int(query.shape[2]), query.device)
    result: tuple[Any, Any] = flex_attention_forward(
        module, query, key, value, attention_mask, scaling=scaling, softcap=softcap, **kwargs
    )
    return result
