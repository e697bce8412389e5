"""The builder's exit codes and progress events, defined once for the builder and the host that runs it."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug: traceback in the log
EXIT_CONFIG = 2  # bad spec, source sha256 mismatch, a patch that does not apply
EXIT_BUILD = 4  # compile or link error (the failing unit and its first error lines are printed)
EXIT_ENV = 5  # no Python of that version, torch not installable, wrong torch variant, no nvcc
EXIT_IMPORT = 6  # the built extension does not import next to torch
EXIT_ABI = 7  # a stable-ABI wheel's extension imports a torch C++ symbol (at::, c10::, torch::)
EXIT_OOM = 75  # a compiler was killed (OOM): rerun with fewer max_jobs in the same build_dir, it resumes
EXIT_INTERRUPTED = 130
EXIT_CONTAINER_KILLED = 137  # docker's --memory limit killed the whole builder (the host sees this)

# Progress lines on stdout: ``@@attnforge {json}`` with "event" = stage | sources | unit | error | result.
EVENT_PREFIX = "@@attnforge "


class BuildFailure(Exception):
    """Ends the build with exit ``code``; ``details`` go into result.json's ``error``."""

    def __init__(self, code: int, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
