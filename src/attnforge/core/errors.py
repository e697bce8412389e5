"""Error hierarchy: each family has its own process exit code (cibuildwheel's habit)."""

from __future__ import annotations


class AttnforgeError(Exception):
    """Base of every error attnforge reports to a user; ``exit_code`` is what the CLI returns."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class ConfigurationError(AttnforgeError):
    """matrix.yaml or a command-line argument is wrong (unknown key, bad value, unknown target)."""

    exit_code = 2


class NothingToDoError(AttnforgeError):
    """The selection produced no valid cell, or every selected cell is invalid."""

    exit_code = 3


class BuildError(AttnforgeError):
    """A cell failed to build (compile error, missing toolkit, OOM after retries, disk full)."""

    exit_code = 4


class EnvironmentProblem(AttnforgeError):
    """Something the build or test needs is absent: no Docker engine, no toolkit, no GPU runtime."""

    exit_code = 5


class TestFailure(AttnforgeError):
    """A smoke or parity test failed."""

    exit_code = 6

    __test__ = False  # keep pytest from collecting it


class PublishError(AttnforgeError):
    """A publish or push did not land (index unreachable, credentials refused, conflicting bytes)."""

    exit_code = 7


class InterruptedByUser(AttnforgeError):
    """Ctrl-C: cleaned up, nothing half-written left behind."""

    exit_code = 130


class RecordRefused(PublishError):
    """A signed record (in-toto statement) is missing, forged, signed by an untrusted key or about other bytes."""
