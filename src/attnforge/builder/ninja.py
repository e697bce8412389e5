"""Following ninja: ``[N/M] cmd`` progress lines, ``FAILED:`` blocks, the setup hook's ``sources`` event,
the number of units in build.ninja and each unit's compile time from ``.ninja_log``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from .exits import EVENT_PREFIX
from .report import Reporter

NINJA_STATUS_RE = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
FAILED_RE = re.compile(r"^FAILED:\s+(?:\[code=(-?\d+)\]\s+)?(.*)$")
OOM_RE = re.compile(
    r"(\bKilled\b|signal 9|Kill signal|SIGKILL|died due to signal|exit(?:ed)? (?:status|code) 137|"
    r"out of memory|virtual memory exhausted|std::bad_alloc|Cannot allocate memory)",
    re.IGNORECASE,
)
ERROR_LINE_RE = re.compile(r"(\berror\b|fatal)", re.IGNORECASE)


def unit_stem(path: str) -> str:
    """``csrc/x/flash_fwd_hdim128_bf16_sm80.cu`` or ``.../flash_fwd_hdim128_bf16_sm80.o`` -> the stem."""
    return os.path.splitext(os.path.basename(path.strip("'\"")))[0]


class UnitCounter:
    """Units finished in either lane (the kernel lane, ninja), announced as ``unit`` events with the build's
    running count; thread-safe."""

    def __init__(self, rep: Reporter, total: int | None = None) -> None:
        self.rep, self.total = rep, total
        self.done: list[str] = []
        self._lock = threading.Lock()

    def finish(self, name: str) -> None:
        with self._lock:
            self.done.append(name)
            done = len(self.done)
        total = max(self.total or done, done)
        self.rep.event("unit", done=done, total=total, name=name, units_total=self.total)


class NinjaParser:
    """Follows ninja's ``[N/M] cmd`` and ``FAILED:`` lines, and the setup hook's ``sources`` and ``lane``
    events."""

    def __init__(self, rep: Reporter, counter: UnitCounter | None = None) -> None:
        self.rep = rep
        self.counter = counter
        self.lane_event: dict[str, Any] | None = None
        self.finished: list[str] = []
        self.failures: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None
        self.sources_event: dict[str, Any] | None = None
        self.units_total: int | None = None
        self.other_errors: list[str] = []

    @staticmethod
    def unit_name(cmd: str) -> str:
        """The source file a compile command compiles (torch's commands say ``-c -c SRC -o OBJ``)."""
        m = re.search(r"\s(\S+\.(?:cu|cpp|cc|cxx|c|hip))\s+-o\s", cmd) or re.search(r"\s-o\s+(\S+)", cmd)
        name = m.group(1) if m else (cmd.split() or ["?"])[-1]
        return os.path.basename(name.strip("'\""))

    def __call__(self, raw: str) -> None:
        line = raw.strip()  # pip -v indents the build's output by two spaces
        if line.startswith(EVENT_PREFIX):
            with contextlib.suppress(ValueError):
                ev = json.loads(line[len(EVENT_PREFIX) :])
                if ev.get("event") == "sources":
                    self.sources_event = ev
                    self.units_total = len(ev.get("compile", [])) + len(ev.get("prebuilt", []))
                    if self.counter is not None:
                        self.counter.total = len(ev.get("compile", []))
                elif ev.get("event") == "lane":
                    self.lane_event = ev
            return
        m = NINJA_STATUS_RE.match(line)
        if m:
            self._current = None
            done, total, cmd = int(m.group(1)), int(m.group(2)), m.group(3)
            name = self.unit_name(cmd)
            self.finished.append(name)
            if self.counter is not None:
                self.counter.finish(name)
            else:
                self.rep.event("unit", done=done, total=total, name=name, units_total=self.units_total)
            return
        m = FAILED_RE.match(line)
        if m:
            obj = m.group(2).split()[0] if m.group(2).split() else "?"
            code = int(m.group(1)) if m.group(1) else None
            self._current = {
                "unit": os.path.basename(obj),
                "object": obj,
                "command": None,
                "lines": [],
                "code": code,
            }
            self.failures.append(self._current)
            if self.finished:  # ninja printed this edge's [N/M] line as it finished (failed): not compiled
                self.finished.pop()
            return
        if line.startswith(("ninja: build stopped", "ninja: error")):
            self._current = None
            self.other_errors.append(line)
            return
        if self._current is not None:
            if self._current["command"] is None and re.search(r"\s-c\s", line):
                self._current["command"] = line
                self._current["unit"] = self.unit_name(line)
            else:
                self._current["lines"].append(line)
        elif ERROR_LINE_RE.search(line) and (
            "undefined reference" in line or "ld:" in line or "error:" in line
        ):
            self.other_errors.append(line)

    def failure_summary(self, oom_killed: bool = False) -> tuple[str, dict[str, Any]]:
        """Classify the failure: ("oom"|"compile"|"other", details).

        A failed unit counts as killed when its output names a kill (``Killed``, signal 9, ...), or is empty
        (the compiler died without a word), or the cgroup's OOM-kill counter rose (``oom_killed``); but never
        when it also shows a real compiler error.
        """
        for fail in self.failures:
            lines = [ln for ln in fail["lines"] if ln]
            real = [
                ln for ln in lines if re.search(r"\berror\b", ln, re.IGNORECASE) and not OOM_RE.search(ln)
            ]
            first = next((i for i, ln in enumerate(lines) if ERROR_LINE_RE.search(ln)), 0)
            fail["error_lines"] = lines[first : first + 20]
            killed = (
                bool(OOM_RE.search("\n".join(lines)))
                or not lines
                or oom_killed
                or fail.get("code") in (137, -9)
            )
            fail["oom"] = killed and not real
        real = [f for f in self.failures if not f["oom"]]
        if real:
            return "compile", {"unit": real[0]["unit"], "lines": real[0]["error_lines"]}
        if self.failures:
            return "oom", {"unit": self.failures[0]["unit"], "lines": self.failures[0]["lines"][-10:]}
        return "other", {"lines": self.other_errors[-20:]}


def build_temp(tree: Path, py_tag: str) -> Path | None:
    """setuptools' ``build/temp.*-<py_tag>`` folder, where build.ninja and the objects are (a free-threaded
    CPython's is ``cpython-314t`` in newer setuptools: that one too)."""
    temps = sorted(tree.glob(f"build/temp.*-{py_tag}")) or sorted(tree.glob(f"build/temp.*-{py_tag}t"))
    return temps[0] if temps else None


def count_ninja_units(tree: Path, py_tag: str) -> int | None:
    temp = build_temp(tree, py_tag)
    if temp is None or not (temp / "build.ninja").is_file():
        return None
    text = (temp / "build.ninja").read_text(encoding="utf-8", errors="replace")
    # torch's rules (compile, cuda_compile) and FA3's own per-arch ones (cuda_compile_sm80_sm90, ...)
    return len(re.findall(r"^build \S+\.o: (?:cuda_)?compile(?:_\w+)? ", text, re.MULTILINE))


def unit_times(tree: Path, py_tag: str) -> dict[str, dict[str, float]]:
    """Each object's compile (start, end) in seconds from ninja's own log, keyed by unit stem.

    ``.ninja_log`` (v5+: ``start_ms end_ms mtime output hash``) keeps the newest line per output; a resumed
    build's finished units keep their first timing.
    """
    temp = build_temp(tree, py_tag)
    log = temp / ".ninja_log" if temp else None
    if log is None or not log.is_file():
        return {}
    out: dict[str, dict[str, float]] = {}
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 4 or not parts[0].isdigit() or not parts[3].endswith(".o"):
            continue
        start, end = int(parts[0]) / 1000.0, int(parts[1]) / 1000.0
        out[unit_stem(parts[3])] = {
            "start_s": round(start, 1),
            "end_s": round(end, 1),
            "s": round(end - start, 1),
        }
    return out
