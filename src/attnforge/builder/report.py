"""Where the builder's words go: tool output and events to stdout and the build log; timed stages."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from .exits import EVENT_PREFIX


class Reporter:
    """Writes tool output and ``@@attnforge`` events to stdout and to the build log."""

    def __init__(self, log_path: Path | None) -> None:
        self.log: IO[str] | None = None
        self.t0 = time.monotonic()  # stage windows count from here
        self.windows: dict[str, list[float]] = {}  # stage -> [start, end] seconds from t0
        self._lock = threading.Lock()  # the kernel lane reports from its own threads
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log = open(log_path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115

    def line(self, text: str) -> None:
        with self._lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            if self.log is not None:
                self.log.write(text + "\n")
                self.log.flush()

    def event(self, event_name: str, /, **fields: Any) -> None:
        payload: dict[str, Any] = {"event": event_name}
        payload.update(fields)
        self.line(EVENT_PREFIX + json.dumps(payload, sort_keys=False))

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


class Stage:
    """Context manager emitting stage start/done events and recording the duration in ``times``."""

    def __init__(self, rep: Reporter, times: dict[str, float], name: str) -> None:
        self.rep, self.times, self.name = rep, times, name
        self.start = 0.0

    def __enter__(self) -> Stage:
        self.start = time.monotonic()
        self.rep.event("stage", stage=self.name, status="start")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        end = time.monotonic()
        dt = round(end - self.start, 1)
        self.times[self.name] = dt
        self.rep.windows[self.name] = [round(self.start - self.rep.t0, 1), round(end - self.rep.t0, 1)]
        self.rep.event("stage", stage=self.name, status="done" if exc is None else "failed", s=dt)
