"""Read a wheel with every file checked against its RECORD; write one reproducibly with RECORD regenerated.

Both sides use the `wheel` project's `WheelFile` (the class behind `wheel unpack/pack/tags`): reading
verifies each member's sha256 against RECORD, writing computes RECORD from what is written. On top of
it: sorted members (`.dist-info` last, RECORD at the very end), timestamps from SOURCE_DATE_EPOCH,
normalized permissions and no directory entries, so the same input gives the same bytes.
"""

from __future__ import annotations

import csv
import email.policy
import io
import os
import stat
import tempfile
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from pathlib import Path
from typing import Any

from attnforge.core.errors import BuildError, EnvironmentProblem

ZIP_EPOCH = 315532800  # 1980-01-01T00:00:00Z, the earliest time a zip entry can hold


def _wheelfile_class() -> Any:
    try:
        from wheel.wheelfile import WheelFile
    except ImportError:  # pragma: no cover - a dependency of attnforge[publish]
        raise EnvironmentProblem(
            "the 'wheel' package is needed to rewrite wheels", hint="pip install 'attnforge[publish]'"
        ) from None
    return WheelFile


def source_date_epoch() -> int:
    """SOURCE_DATE_EPOCH when set (reproducible builds' convention), else the zip epoch (1980-01-01)."""
    raw = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not raw:
        return ZIP_EPOCH
    try:
        return max(int(raw), ZIP_EPOCH)
    except ValueError:
        raise BuildError(f"SOURCE_DATE_EPOCH={raw!r} is not an integer") from None


@dataclass
class Member:
    """One file in a wheel."""

    data: bytes
    executable: bool = False


@dataclass
class WheelContents:
    """A wheel's files (RECORD and its signatures left out: they are regenerated)."""

    filename: str
    dist_info: str
    members: dict[str, Member] = field(default_factory=dict)

    def text(self, name: str) -> str:
        return self.members[name].data.decode("utf-8")

    def message(self, name: str) -> Message:
        """An email-style file of the .dist-info (METADATA, WHEEL) parsed as `wheel tags` does."""
        return BytesParser(policy=email.policy.compat32).parsebytes(self.members[name].data)

    def toplevel(self) -> list[str]:
        """Top-level library entries (`flash_attn`, `flash_attn_2_cuda.cpython-311-...so`)."""
        tops = set()
        for name in self.members:
            first = name.split("/", 1)[0]
            if first.endswith((".dist-info", ".data")):
                continue
            tops.add(first)
        return sorted(tops)


def read_wheel(path: Path) -> WheelContents:
    """Every member, each verified against RECORD; BuildError on a corrupt or inconsistent wheel."""
    wheel_file = _wheelfile_class()
    from wheel.wheelfile import WheelError

    try:
        with wheel_file(str(path), "r") as wf:
            record_path: str = wf.record_path
            dist_info: str = wf.dist_info_path
            record_names = {
                row[0]
                for row in csv.reader(io.StringIO(wf.read(record_path).decode("utf-8")))
                if row and not row[0].endswith("/")
            }
            skip = {record_path, record_path + ".jws", record_path + ".p7s"}
            contents = WheelContents(filename=path.name, dist_info=dist_info)
            for info in wf.infolist():
                if info.is_dir() or info.filename in skip:
                    continue
                mode = (info.external_attr >> 16) & 0o777
                contents.members[info.filename] = Member(wf.read(info), executable=bool(mode & 0o111))
    except (WheelError, zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as exc:
        raise BuildError(f"{path.name}: not a valid wheel: {exc}") from None
    missing = sorted(record_names - set(contents.members) - skip)
    if missing:
        raise BuildError(f"{path.name}: RECORD lists files the archive lacks: {', '.join(missing[:5])}")
    return contents


def _ordered(names: list[str], dist_info: str) -> list[str]:
    """Library files first, then .dist-info (wheel spec: metadata last), each sorted."""
    lib = sorted(n for n in names if not n.startswith(dist_info + "/"))
    meta = sorted(n for n in names if n.startswith(dist_info + "/"))
    return lib + meta


def write_wheel(
    directory: Path, filename: str, dist_info: str, members: Mapping[str, Member], epoch: int
) -> Path:
    """Write `directory/filename` atomically; RECORD is computed by WheelFile from the bytes written."""
    wheel_file = _wheelfile_class()
    date_time = time.gmtime(max(epoch, ZIP_EPOCH))[:6]

    def zinfo(name: str, executable: bool) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time=date_time)
        info.compress_type = zipfile.ZIP_DEFLATED
        info.create_system = 3  # unix, so external_attr carries the mode
        info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
        return info

    class _Reproducible(wheel_file):  # type: ignore[misc,valid-type]
        """WheelFile whose own RECORD entry gets the fixed timestamp too."""

        def writestr(self, zinfo_or_arcname: Any, data: Any, compress_type: Any = None) -> None:
            if isinstance(zinfo_or_arcname, str):
                zinfo_or_arcname = zinfo(zinfo_or_arcname, False)
            super().writestr(zinfo_or_arcname, data, compress_type)

    directory.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=".finalize-", dir=directory))
    try:
        tmp = tmpdir / filename
        with _Reproducible(str(tmp), "w") as wf:
            if wf.dist_info_path != dist_info:
                raise BuildError(f"{filename}: .dist-info would be {wf.dist_info_path}, not {dist_info}")
            for name in _ordered(list(members), dist_info):
                wf.writestr(zinfo(name, members[name].executable), members[name].data)
        tmp.chmod(0o644)
        final = directory / filename
        os.replace(tmp, final)
        return final
    finally:
        for leftover in tmpdir.iterdir():
            leftover.unlink()
        tmpdir.rmdir()
