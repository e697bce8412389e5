"""`attnforge yank` / `unyank`: withdraw a published wheel (PEP 592) or bring it back, without deleting it.

On a static index the file's record gets the reason (and the time); the pages are regenerated from the
records in a new generation swapped in like a publish (`StaticIndex.update`: the same lock, the same
rename): `data-yanked="<reason>"` on the PEP 503 link, `"yanked": "<reason>"` in the PEP 691 file entry, and
the coverage page shows it. pip then skips the file unless a requirement pins its version exactly (and warns
with the reason when it does); `attnforge which` never proposes it; `attnforge doctor` warns where it is
installed. A pypiserver has no yank (its API can only delete a whole version): refused with a message.
"""

from __future__ import annotations

import datetime as dt
import difflib
from dataclasses import dataclass
from pathlib import Path

from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.matrix.destinations import Destination
from attnforge.publish.index import FileRecord, StaticIndex


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def wheel_filename(wheel: str) -> str:
    """The file name a WHEEL argument names: a bare name, or a path (only its last part counts)."""
    name = Path(wheel).name
    if not name.endswith(".whl"):
        raise ConfigurationError(f"{wheel}: not a wheel file name (expected <name>-<version>-...-<tag>.whl)")
    return name


def _find(records: dict[str, FileRecord], filename: str, root: Path) -> FileRecord:
    record = records.get(filename)
    if record is None:
        guess = difflib.get_close_matches(filename, list(records), n=1)
        hint = f"did you mean {guess[0]}?" if guess else f"it holds {len(records)} file(s)"
        raise ConfigurationError(f"{filename}: not in the index at {root} ({hint})")
    return record


@dataclass
class YankResult:
    """What a yank or unyank did."""

    destination: str
    filename: str
    reason: str | None  # the reason now recorded (None: not yanked)
    generation: str | None  # the new generation, None when nothing changed

    def describe(self) -> str:
        state = f"yanked ({self.reason})" if self.reason is not None else "not yanked"
        done = "now" if self.generation else "already"
        return f"{self.filename}: {done} {state} in {self.destination}"


MAX_REASON_CHARS = 500


def set_yanked(index: StaticIndex, wheel: str, reason: str | None) -> YankResult:
    """Yank `wheel` with `reason`, or unyank it (`reason` None); a no-op when it already is so."""
    filename = wheel_filename(wheel)
    if reason is not None and not reason.strip():
        raise ConfigurationError("--reason is empty: say why the wheel is withdrawn (pip shows it to users)")
    reason = reason.strip() if reason is not None else None
    if reason is not None and (len(reason) > MAX_REASON_CHARS or "\n" in reason or "\r" in reason):
        raise ConfigurationError(
            f"--reason is {len(reason):,} characters{' over several lines' if chr(10) in reason else ''}: "
            f"one line of at most {MAX_REASON_CHARS} (pip prints it in every install's warning)"
        )

    def change(records: dict[str, FileRecord]) -> list[str]:
        record = _find(records, filename, index.root)
        if record.yanked == reason:
            return []
        record.yanked = reason
        record.yanked_time = _now() if reason is not None else None
        return [filename]

    report = index.update(change)
    return YankResult(report.destination, filename, reason, report.generation)


def refuse_unsupported(dest: Destination, label: str) -> None:
    """Destinations where a file cannot be marked yanked: say so (exit 7) instead of doing something else."""
    if dest.kind == "pypiserver":
        raise PublishError(
            f"destination '{label}' is a pypiserver ({dest.url}): it has no yank (PEP 592); its API can only "
            "delete every file of a version, which breaks lock files that pin it; nothing was changed",
            hint="withdraw it on a static index (kind: static), or delete it on the server by hand",
        )
    if dest.kind != "static":
        raise ConfigurationError(
            f"destination '{label}' is a {dest.kind}: wheels are yanked on a 'static' index"
        )
