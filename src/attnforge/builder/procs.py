"""Running the build's processes: streamed output, peak memory of the process tree, cgroup OOM kills
(MAX_JOBS from cores and memory is `parallelism`'s)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .report import Reporter

SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c", ".hip")


class RssSampler(threading.Thread):
    """Samples /proc every ``interval`` s: peak RSS of the process tree under ``root`` and of one process."""

    def __init__(self, root: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak_tree = 0
        self.peak_single = 0
        self.unit_peaks: dict[str, int] = {}  # unit stem -> peak RSS of its compiler and that one's children
        self._units: dict[int, str | None] = {}
        self._halt = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def stop(self) -> None:
        self._halt.set()

    def _sample(self) -> None:
        parents: dict[int, int] = {}
        rss: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read().decode(errors="replace")
                with open(f"/proc/{entry}/statm", "rb") as fh:
                    pages = int(fh.read().split()[1])
            except (OSError, ValueError, IndexError):
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            pid = int(entry)
            parents[pid] = int(fields[1])
            rss[pid] = pages * self._page
        total = 0
        per_unit: dict[str, int] = {}
        for pid, size in rss.items():
            p, hops, unit = pid, 0, None
            while p > 0 and hops < 64:  # the builder is pid 1 in a container
                if unit is None:
                    unit = self._unit_of(p)
                if p == self.root:
                    total += size
                    self.peak_single = max(self.peak_single, size)
                    if unit:
                        per_unit[unit] = per_unit.get(unit, 0) + size
                    break
                p, hops = parents.get(p, 0), hops + 1
        self.peak_tree = max(self.peak_tree, total)
        for unit, size in per_unit.items():
            self.unit_peaks[unit] = max(self.unit_peaks.get(unit, 0), size)
        self._units = {p: u for p, u in self._units.items() if p in rss}  # pids are reused

    def _unit_of(self, pid: int) -> str | None:
        """The unit a compiler process compiles (its ``-c SRC`` argument), cached per pid."""
        if pid not in self._units:
            unit = None
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    args = fh.read().decode(errors="replace").split("\0")
                if "-c" in args:
                    srcs = [a for a in args if a.endswith(SOURCE_SUFFIXES)]
                    unit = os.path.splitext(os.path.basename(srcs[-1]))[0] if srcs else None
            self._units[pid] = unit
        return self._units[pid]

    def run(self) -> None:
        while not self._halt.is_set():
            with contextlib.suppress(Exception):
                self._sample()
            self._halt.wait(self.interval)


_CURRENT: list[subprocess.Popen[str]] = []


def _start(cmd: list[str], env: dict[str, str], cwd: str | None) -> subprocess.Popen[str]:
    """``cmd`` started in its own session with its output in one text pipe, and stopped on SIGTERM
    (``terminate_children``); the caller removes it from ``_CURRENT`` when it ends."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        cwd=cwd,
        bufsize=1,
        start_new_session=True,
    )
    _CURRENT.append(proc)
    return proc


def stream(
    cmd: list[str],
    env: dict[str, str],
    rep: Reporter,
    cwd: str | None = None,
    on_line: Callable[[str], None] | None = None,
    sampler: bool = False,
) -> tuple[int, dict[str, Any]]:
    """Run ``cmd`` in its own session, echo its output line by line; (exit code, peak RSS facts in bytes)."""
    proc = _start(cmd, env, cwd)
    smp = RssSampler(proc.pid) if sampler else None
    if smp is not None:
        smp.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            text = raw.rstrip("\n")
            rep.line(text)
            if on_line is not None:
                on_line(text)
        rc = proc.wait()
    finally:
        _CURRENT.remove(proc)
        if smp is not None:
            smp.stop()
    facts: dict[str, Any] = {"tree": 0, "single": 0, "units": {}}
    if smp is not None:
        facts = {"tree": smp.peak_tree, "single": smp.peak_single, "units": dict(smp.unit_peaks)}
    return rc, facts


def run_tracked(
    cmd: list[str], env: dict[str, str], cwd: str, started: Callable[[subprocess.Popen[str]], None]
) -> tuple[int, str]:
    """Run ``cmd`` to its end in its own session, stopped with the build on SIGTERM; ``started`` gets the
    process (to stop it earlier); (exit code, output)."""
    proc = _start(cmd, env, cwd)
    started(proc)
    try:
        out, _ = proc.communicate()
    finally:
        _CURRENT.remove(proc)
    return proc.returncode, out


def stop_children() -> None:
    """Send SIGTERM to the process groups of the tools this process runs."""
    for proc in list(_CURRENT):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)


def terminate_children(signum: int, frame: Any) -> None:
    """SIGTERM handler: stop the running tools' process groups, then end the build as interrupted."""
    stop_children()
    raise KeyboardInterrupt


def cgroup_oom_kills() -> int:
    """The cgroup's OOM-kill counter (v2 memory.events, v1 memory.oom_control); 0 when unknown."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(path).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0
