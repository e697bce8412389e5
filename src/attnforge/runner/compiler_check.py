"""The runner's host-compiler check: does an exception thrown through torch from code that this machine's
C++ compiler (``$CXX``, else ``c++``) built reach Python, or crash the process?

It runs the builder's own probe (``builder.compiler.choose_host_compiler``): a compiler that fails it makes
excluded head dims of a wheel built here SIGSEGV and AOTInductor packages crash on load (a gcc wrapper named
by CC/CXX that links its own crt files does this). attnforge's builder then switches to a working system g++
by itself; the check says so, and what to export for other tools.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from attnforge.builder.compiler import choose_host_compiler
from attnforge.builder.exits import BuildFailure
from attnforge.runner.checks import Check


class _Collect:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)


def check_compiler(python: str | None) -> Check:
    """pass: $CXX works; warn: it doesn't but a fallback does (named); fail (not blocking): none works."""
    if not python:
        return Check("compiler", "warn", "no Python with torch: the C++ exception probe did not run")
    first = os.environ.get("CXX") or "c++"
    with tempfile.TemporaryDirectory(prefix="attnforge-cxx-probe-") as tmp:
        try:
            got: dict[str, Any] = choose_host_compiler(python, Path(tmp), dict(os.environ), _Collect())  # type: ignore[arg-type]
        except BuildFailure as exc:
            return Check("compiler", "fail", exc.message)
    if not got.get("switched"):
        return Check("compiler", "pass", f"{first}: C++ exceptions thrown through torch reach Python")
    why = got["rejected"].get(first, "failed the probe")
    cc = f" CC={got['cc']}" if got.get("cc") else ""
    return Check(
        "compiler",
        "warn",
        f"{first}: {why}; {got['cxx']} works (attnforge's builder switches to it by itself; "
        f"for other builds export CXX={got['cxx']}{cc})",
    )
