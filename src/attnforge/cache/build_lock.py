"""The cache's build lock: builds hold it shared for their whole run; prune needs it exclusively.

`fcntl.flock` on `<cache>/.build.lock`: any number of builds run side by side, a prune refuses to start
while one runs, and a build that starts during a prune waits for it. The kernel drops the lock when the
holder dies, so a killed build never leaves the cache locked.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from attnforge.core.errors import EnvironmentProblem

LOCK_NAME = ".build.lock"


def lock_path(cache: Path) -> Path:
    return cache / LOCK_NAME


@contextmanager
def build_lock(cache: Path, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock shared while building; waits (after saying so) while a prune holds it."""
    cache.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(cache), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                on_wait(f"waiting for `attnforge cache prune` to finish with {cache}")
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _try_exclusive(cache: Path) -> int | None:
    """An fd holding the lock exclusively, or None when a build holds it."""
    fd = os.open(lock_path(cache), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def build_running(cache: Path) -> bool:
    """True while a build holds the cache's lock (no lock file: no build has run; none is created here)."""
    if not lock_path(cache).is_file():
        return False
    fd = _try_exclusive(cache)
    if fd is None:
        return True
    os.close(fd)
    return False


@contextmanager
def prune_lock(cache: Path) -> Iterator[None]:
    """Hold the lock exclusively; EnvironmentProblem at once when a build holds it."""
    if not cache.is_dir():
        yield
        return
    fd = _try_exclusive(cache)
    if fd is None:
        raise EnvironmentProblem(
            f"a build is running with the cache {cache} (it holds {lock_path(cache)}); nothing was removed",
            hint="prune after the build finishes; --dry-run shows what would go",
        )
    try:
        yield
    finally:
        os.close(fd)
