"""The seam between the runner checks and the machine: commands and a few OS facts.

`SystemHost` asks the real machine. `ReplayHost` answers from a recorded scenario folder
(`scenario.json` + output files), so the parsers and rules run unchanged on recorded nvidia-smi,
amd-smi, rocm-smi and docker outputs (tests, and `attnforge runner check --replay DIR` demos).
"""

from __future__ import annotations

import fnmatch
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from attnforge.core.errors import ConfigurationError
from attnforge.engine.resources import Machine, detect_machine

NOT_FOUND = 127
TIMED_OUT = 124


@dataclass(frozen=True)
class CommandResult:
    """What a command printed and returned (127: not found, 124: timed out)."""

    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def reason(self) -> str:
        """A one-line reason for a failed command."""
        if self.returncode == NOT_FOUND:
            return "not found"
        if self.returncode == TIMED_OUT:
            return "timed out"
        lines = [ln.strip() for ln in (self.stderr or self.stdout).splitlines() if ln.strip()]
        return f"exit {self.returncode}: {lines[-1][:300] if lines else 'no output'}"


class Host(Protocol):
    """Everything the checks learn from the machine."""

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> CommandResult: ...

    def machine(self) -> Machine: ...

    def disk_free_gb(self, path: Path) -> tuple[float, Path]: ...

    def device_access(self, path: str) -> str: ...

    def cpu_arch(self) -> str: ...

    def which(self, name: str) -> str | None: ...


def existing_parent(path: Path) -> Path:
    """The path itself or its nearest existing parent (a cache folder may not exist yet)."""
    p = path.resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


class SystemHost:
    """The real machine."""

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> CommandResult:
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            return CommandResult(NOT_FOUND, "", f"{argv[0]}: not found")
        except subprocess.TimeoutExpired:
            return CommandResult(TIMED_OUT, "", f"{argv[0]}: no answer within {timeout:g} s")
        except OSError as exc:
            return CommandResult(126, "", f"{argv[0]}: {exc}")
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def machine(self) -> Machine:
        return detect_machine()

    def disk_free_gb(self, path: Path) -> tuple[float, Path]:
        where = existing_parent(path)
        return shutil.disk_usage(where).free / 1024**3, where

    def device_access(self, path: str) -> str:
        """'rw' when readable and writable, 'exists' when present but not usable, 'missing'."""
        if not os.path.exists(path):
            return "missing"
        return "rw" if os.access(path, os.R_OK | os.W_OK) else "exists"

    def cpu_arch(self) -> str:
        return platform.machine()

    def which(self, name: str) -> str | None:
        return shutil.which(name)


class ReplayHost:
    """Answers from `scenario.json` in a folder of recorded outputs.

    ``commands`` is a list of ``{"argv": [...glob patterns...], "returncode": 0, "stdout_file": "x.txt"}``
    (or inline ``stdout``/``stderr``); the first entry whose patterns match the argv answers, and a
    command with no entry is 'not found'. ``machine``, ``disk_free_gb``, ``devices``, ``cpu_arch`` and
    ``which`` give the rest.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        try:
            self.data: dict[str, Any] = json.loads((folder / "scenario.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"replay scenario {folder}: {exc}") from None
        self.calls: list[list[str]] = []

    def _text(self, entry: dict[str, Any], key: str) -> str:
        name = entry.get(f"{key}_file")
        if name:
            return (self.folder / str(name)).read_text(encoding="utf-8")
        return str(entry.get(key, ""))

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> CommandResult:
        args = [Path(argv[0]).name, *argv[1:]] if argv else []
        self.calls.append(args)
        for entry in self.data.get("commands", []):
            pattern = [str(p) for p in entry["argv"]]
            if len(pattern) == len(args) and all(
                fnmatch.fnmatchcase(a, p) for a, p in zip(args, pattern, strict=True)
            ):
                return CommandResult(
                    int(entry.get("returncode", 0)), self._text(entry, "stdout"), self._text(entry, "stderr")
                )
        return CommandResult(NOT_FOUND, "", f"{args[0] if args else '?'}: not found")

    def machine(self) -> Machine:
        m = self.data.get("machine", {})
        return Machine(int(m.get("cores", 2)), float(m.get("memory_available_gb", 8.0)), "recorded")

    def disk_free_gb(self, path: Path) -> tuple[float, Path]:
        return float(self.data.get("disk_free_gb", 100.0)), path

    def device_access(self, path: str) -> str:
        return str(self.data.get("devices", {}).get(path, "missing"))

    def cpu_arch(self) -> str:
        return str(self.data.get("cpu_arch", "x86_64"))

    def which(self, name: str) -> str | None:
        found = self.data.get("which", {})
        if name in found:
            return str(found[name]) if found[name] else None
        return (
            f"/usr/bin/{name}" if any(e["argv"][0] == name for e in self.data.get("commands", [])) else None
        )
