"""The Python environment `which` and `doctor` inspect: the user's, not attnforge's own.

`choose_interpreter` picks it by the first rule that applies: `--python PATH` (an interpreter, a command
on PATH, or a venv/conda folder), the active venv (`$VIRTUAL_ENV/bin/python`), the active conda
environment (`$CONDA_PREFIX/bin/python`), the first `python3` on PATH; attnforge's own interpreter only
when none of these exists. A variable that names a folder without an interpreter is passed over, and the
report says so. `probe_environment` runs the environment probe with that interpreter (a separate process, JSON out,
bounded in time: torch is never imported into attnforge's process) and `Inspected` says what was found:
the interpreter's path and Python, and its torch (release, CUDA/ROCm build, C++ ABI) or "no torch".
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.engine.environment import Env, run_probe

PROBE_TIMEOUT_S = 300  # importing torch (and a CUDA extension) on a cold disk takes tens of seconds

RULES = {
    "--python": "--python",
    "VIRTUAL_ENV": "$VIRTUAL_ENV (the active venv)",
    "CONDA_PREFIX": "$CONDA_PREFIX (the active conda environment)",
    "PATH": "the first python3 on PATH",
    "own": "attnforge's own interpreter (no venv, conda environment or python3 on PATH)",
}


@dataclass(frozen=True)
class Interpreter:
    """The interpreter to inspect and the rule that chose it (a key of RULES)."""

    path: str
    rule: str
    passed_over: tuple[str, ...] = field(default=())  # variables naming a folder without an interpreter

    @property
    def chosen_by(self) -> str:
        return RULES[self.rule]


def _in_prefix(prefix: str) -> Path | None:
    """The interpreter of a venv or conda folder (`bin/python`, `bin/python3`), or None."""
    for name in ("python", "python3"):
        exe = Path(prefix) / "bin" / name
        if exe.is_file() and os.access(exe, os.X_OK):
            return exe
    return None


def _given(python: str, path_var: str | None) -> str:
    """`--python`'s interpreter: a file, a folder holding bin/python, or a command found on PATH."""
    given = Path(python).expanduser()
    if given.is_dir():
        exe = _in_prefix(str(given))
        if exe is None:
            raise ConfigurationError(
                f"--python {python}: a folder without bin/python (not a venv or conda env)"
            )
        return str(exe)
    if given.is_file():
        if not os.access(given, os.X_OK):
            raise ConfigurationError(f"--python {python}: not executable")
        return str(given)
    found = shutil.which(python, path=path_var) if os.sep not in python else None
    if found is None:
        raise ConfigurationError(
            f"--python {python}: no such interpreter (neither a file nor a command on PATH)"
        )
    return found


def choose_interpreter(python: str | None = None, environ: Mapping[str, str] | None = None) -> Interpreter:
    """The interpreter to inspect: `python` (--python) > $VIRTUAL_ENV > $CONDA_PREFIX > python3 on PATH >
    attnforge's own. ConfigurationError when `python` names no interpreter."""
    env = os.environ if environ is None else environ
    if python:
        return Interpreter(_given(python, env.get("PATH")), "--python")
    passed_over: list[str] = []
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = env.get(var)
        if not prefix:
            continue
        exe = _in_prefix(prefix)
        if exe is not None:
            return Interpreter(str(exe), var, tuple(passed_over))
        passed_over.append(f"${var}={prefix} holds no bin/python")
    on_path = shutil.which("python3", path=env.get("PATH", ""))
    if on_path:
        return Interpreter(on_path, "PATH", tuple(passed_over))
    return Interpreter(sys.executable, "own", tuple(passed_over))


@dataclass(frozen=True)
class Inspected:
    """What the probe found in the chosen interpreter's environment."""

    interpreter: Interpreter
    executable: str  # sys.executable there (a venv's python may be a symlink)
    python: str  # "3.11.7"
    torch: str | None  # "2.13.0+cpu"; None: no torch importable
    accel: str | None  # "cu130" | "rocm6.4" | None (CPU-only)
    cxx11_abi: bool | None
    torch_error: str | None = None  # why torch did not import

    @classmethod
    def from_probe(cls, interpreter: Interpreter, data: dict[str, Any]) -> Inspected:
        env = Env.from_probe(data)
        torch = data.get("torch") or {}
        return cls(
            interpreter=interpreter,
            executable=str(data.get("executable") or interpreter.path),
            python=str(data.get("python") or "?"),
            torch=env.torch,
            accel=env.accel,
            cxx11_abi=env.cxx11_abi,
            torch_error=None if torch.get("installed") else str(torch.get("error") or "not installed"),
        )

    @property
    def path(self) -> str:
        """The interpreter as the user would type it (the venv's bin/python, not its symlink target)."""
        return self.interpreter.path

    def describe_torch(self) -> str:
        if self.torch is None:
            return "no torch"
        abi = "" if self.cxx11_abi is None else f", cxx11abi {'TRUE' if self.cxx11_abi else 'FALSE'}"
        return f"torch {self.torch} ({self.accel or 'CPU-only'}{abi})"

    def describe(self) -> str:
        """`/venv/bin/python (Python 3.11.7, chosen by $VIRTUAL_ENV (the active venv)), torch 2.13.0+cpu (...)`."""
        text = f"{self.path} (Python {self.python}, chosen by {self.interpreter.chosen_by}), {self.describe_torch()}"
        if self.interpreter.passed_over:
            text += f"; passed over: {'; '.join(self.interpreter.passed_over)}"
        return text

    def install_torch(self) -> str:
        """The command that installs torch into this interpreter's environment."""
        return f"{self.path} -m pip install torch"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "executable": self.executable,
            "chosen_by": self.interpreter.rule,
            "passed_over": list(self.interpreter.passed_over),
            "python": self.python,
            "torch": None
            if self.torch is None
            else {"version": self.torch, "accelerator": self.accel or "cpu", "cxx11_abi": self.cxx11_abi},
        }


def probe_environment(
    interpreter: Interpreter,
    project: str | None = None,
    module: str | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> tuple[dict[str, Any], Inspected]:
    """Run the probe with `interpreter` (with `project`: its installed distribution, importing `module`);
    EnvironmentProblem naming the interpreter and the rule that chose it when the probe does not answer."""
    try:
        data = run_probe(interpreter.path, project, module, timeout=timeout)
    except EnvironmentProblem as exc:
        raise EnvironmentProblem(
            f"{exc.message} (interpreter chosen by {interpreter.chosen_by})",
            hint="name another with --python PATH",
        ) from None
    return data, Inspected.from_probe(interpreter, data)
