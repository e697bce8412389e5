"""A drop-in for ``torch.compile(flex_attention)`` in a plain script: the one line
``flex = attnforge_flex.flex_attention`` instead of ``flex = torch.compile(flex_attention)``.

A call is served when it has no ``score_mod``, no ``return_lse``/``return_aux`` and no ``kernel_options``, and
its block mask is one a built variant has: no block mask (full attention), or one whose ``mask_mod`` gives the
same answers as the variant's causal or sliding-window mask. That is checked by evaluating the caller's
``mask_mod`` over the whole (query, key) grid, once per block-mask object (rows in chunks, at batch and head
0 and at the last batch and head). Everything else goes to ``torch.compile(flex_attention)`` with the same
arguments.
"""

from __future__ import annotations

from typing import Any

from . import mods
from .server import Call, Server, matches

_server: Server | None = None
_compiled: Any = None
_identified: dict[int, tuple[Any, dict[tuple[str, Any], bool]]] = {}  # id(block mask) -> (it, answers)
ROWS = 1024


def enable(artifacts: Any = None) -> Server:
    """Serve ``flex_attention`` calls from ``artifacts`` (default: the wheel's); returns the ``Server``."""
    global _server
    _server = Server(artifacts, client="torch")
    return _server


def _same_mask(block_mask: Any, kind: str, window: Any, seq_len: int, batch: int, heads: int) -> bool:
    """Whether ``block_mask.mask_mod`` equals the variant mask ``kind`` over the ``seq_len`` x ``seq_len`` grid."""
    import torch

    ours = mods.mask_mod_for({"mask": kind, "window": window}, block_mask.kv_num_blocks.device)
    theirs = block_mask.mask_mod
    if ours is None or theirs is None or tuple(block_mask.seq_lengths) != (seq_len, seq_len):
        return False
    dev = block_mask.kv_num_blocks.device
    kv = torch.arange(seq_len, device=dev).view(1, -1)
    for b, h in ((0, 0), (batch - 1, heads - 1)):
        bt, ht = (torch.tensor(x, device=dev) for x in (b, h))
        for start in range(0, seq_len, ROWS):
            q = torch.arange(start, min(seq_len, start + ROWS), device=dev).view(-1, 1)
            try:
                got = torch.as_tensor(theirs(bt, ht, q, kv)).expand(q.shape[0], seq_len)
            except Exception:  # a mask_mod that only works under vmap: not identified
                return False
            if not torch.equal(got.bool(), torch.as_tensor(ours(bt, ht, q, kv)).expand(q.shape[0], seq_len)):
                return False
    return True


def _kind(block_mask: Any, call: Call, server: Server) -> tuple[str, Any] | None:
    """The (mask, window) of a built variant that ``block_mask`` equals, or None."""
    if block_mask is None:
        return "full", None
    entry = _identified.get(id(block_mask))
    if entry is None or entry[0] is not block_mask:
        if len(_identified) >= 32:
            _identified.pop(next(iter(_identified)))
        entry = _identified[id(block_mask)] = (block_mask, {})
    answers = entry[1]
    kinds = {
        (s["mask"], s.get("window")) for s in server.specs if s.get("mask") in ("causal", "sliding_window")
    }
    for kind, window in sorted(kinds, key=str):
        probe = Call(**{**call.__dict__, "mask": kind, "window": window})
        if not any(matches(s, probe) for s in server.specs):
            continue
        if (kind, window) not in answers:
            answers[(kind, window)] = _same_mask(
                block_mask, kind, window, call.seq_len, call.batch, call.heads_q
            )
        if answers[(kind, window)]:
            return kind, window
    return None


def flex_attention(
    query: Any,
    key: Any,
    value: Any,
    score_mod: Any = None,
    block_mask: Any = None,
    scale: float | None = None,
    enable_gqa: bool = False,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``torch.nn.attention.flex_attention.flex_attention``'s signature; served or compiled."""
    import torch

    global _compiled
    plain = (
        score_mod is None
        and not args
        and not any(kwargs.get(k) for k in ("return_lse", "return_aux", "kernel_options"))
        and query.shape[2] == key.shape[2]
        and not torch.compiler.is_compiling()
    )
    if plain and _server is not None and _server.disabled is None:
        call = Call.of(query, key, value, "full", scale=scale)
        kind = _kind(block_mask, call, _server)
        if kind is None:
            _server.tell(call, "its block mask is none of the built variants' masks")
            _server.counts["not served"] += 1
        else:
            call = Call(**{**call.__dict__, "mask": kind[0], "window": kind[1]})
            out = _server.run(call, query, key, value)
            if out is not None:
                return out
    if _compiled is None:
        from torch.nn.attention.flex_attention import flex_attention as flex

        _compiled = torch.compile(flex)
    return _compiled(query, key, value, score_mod, block_mask, scale, enable_gqa, *args, **kwargs)
