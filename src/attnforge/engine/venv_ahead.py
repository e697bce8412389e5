"""Docker cells' torch venvs, made on the host while the builder images build.

The docker backend mounts the host's Python prefix and the build cache at the same paths, so a venv the host
makes with that Python is the venv the builder in the container looks for: ``builder.torchenv.ensure_venv``
holds a lock on it while pip installs and reuses it by its marker. pip's download and unpack of torch and its
CUDA libraries (1-2 minutes on a fresh machine) then overlaps the image builds, which wait mostly on the network
and the disk, instead of competing with the cell's compilers. A failure here costs only that overlap: the
builder makes the venv itself and reports pip's error the usual way.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from attnforge.builder.procs import stop_children
from attnforge.builder.report import Reporter
from attnforge.builder.spec import BuildSpec
from attnforge.builder.torchenv import VENV_MARKER, ensure_venv
from attnforge.engine.progress import ProgressView


class LogOnlyReporter(Reporter):
    """The builder's reporter writing to its log file only: the host's progress view owns the terminal."""

    def line(self, text: str) -> None:
        with self._lock:
            if self.log is not None:
                self.log.write(text + "\n")
                self.log.flush()


class VenvAhead:
    """One thread per venv: ``ensure_venv`` with the interpreter and pip environment the container will use."""

    def __init__(self, logs: Path, view: ProgressView) -> None:
        self.logs = logs
        self.view = view
        self.started: dict[str, threading.Thread] = {}  # venv folder -> its thread

    def start(self, spec: BuildSpec, env: dict[str, str]) -> bool:
        """Start making ``spec``'s venv unless it exists or is being made; whether a thread started."""
        venv = Path(spec.venv_dir)
        if spec.venv_dir in self.started or (venv / VENV_MARKER).is_file():
            return False
        thread = threading.Thread(target=self._make, args=(spec, env), name=f"venv-{venv.name}", daemon=True)
        self.started[spec.venv_dir] = thread
        thread.start()
        return True

    def _make(self, spec: BuildSpec, env: dict[str, str]) -> None:
        venv = Path(spec.venv_dir)
        log = self.logs / f"venv-{venv.name}.log"
        self.view.log(f"torch venv {venv.name}: installing on the host while the images build (log: {log})")
        rep = LogOnlyReporter(log)
        start = time.monotonic()
        try:
            ensure_venv(spec, rep, env)
            self.view.log(f"torch venv {venv.name}: ready in {time.monotonic() - start:.0f} s")
        except Exception as exc:  # the builder makes it and reports why; nothing is lost but the overlap
            self.view.log(f"torch venv {venv.name}: not made ahead ({exc}); the builder makes it", "warning")
        finally:
            rep.close()

    def stop(self) -> None:
        """Stop a pip still running (an interrupted or failed build); its venv has no marker and is remade."""
        if any(t.is_alive() for t in self.started.values()):
            stop_children()
        for thread in self.started.values():
            thread.join(timeout=10)
