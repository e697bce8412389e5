"""Progress messages through a context (`core.log_context`) instead of a callback in every signature."""

from __future__ import annotations

import threading
from contextvars import copy_context

from attnforge.core.log_context import log, logging_to


def test_messages_go_to_the_innermost_sink_and_the_outer_one_comes_back() -> None:
    outer: list[str] = []
    inner: list[str] = []
    log("dropped: no sink yet")
    with logging_to(outer.append):
        log("a")
        with logging_to(inner.append):
            log("b")
        log("c")
    log("dropped again")
    assert (outer, inner) == (["a", "c"], ["b"])


def test_a_thread_started_in_the_context_keeps_its_sink() -> None:
    seen: list[str] = []
    with logging_to(seen.append):
        ctx = copy_context()
        worker = threading.Thread(target=ctx.run, args=(log, "from a thread"))
        worker.start()
        worker.join()
    assert seen == ["from a thread"]
