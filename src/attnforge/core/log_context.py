"""Where progress messages go, as a context instead of a callback handed down every call: a command sets the
sink once (`logging_to`), and the code below it calls `log`. Messages with no sink set are dropped.

A context variable, so each thread and asyncio task sees the sink of the context it was started in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Sink = Callable[[str], None]

_SINK: ContextVar[Sink | None] = ContextVar("attnforge_log_sink", default=None)


def log(message: str) -> None:
    """Send `message` to the sink of the current context (nowhere when none is set)."""
    sink = _SINK.get()
    if sink is not None:
        sink(message)


@contextmanager
def logging_to(sink: Sink) -> Iterator[None]:
    """Within the block, `log` sends to `sink`; the sink before it comes back afterwards."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)
