"""`attnforge-index.json` read as untrusted input: anyone with write access to the index folder can edit it,
and every name in it becomes a path. Each record is checked before it is used: a file name that is a
valid wheel name, a project that is the wheel's, a variant that is one plain folder name, digests and
sizes of the right shape. A bad record is a one-line PublishError naming the file and the record."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion

from attnforge.core.errors import PublishError

MARKER_MAX_BYTES = 256 * 1024 * 1024  # ~1 KB a wheel: room for a quarter of a million wheels
VARIANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_STRINGS = ("filename", "project", "version", "variant", "sha256", "metadata_sha256", "upload_time", "parity")
_OPTIONAL = ("requires_python", "yanked", "yanked_time")
FIELDS = frozenset((*_STRINGS, *_OPTIONAL, "size"))


def safe_variant(variant: str) -> bool:
    """One plain folder name (no `/`, no `..`, no leading dot)."""
    return bool(VARIANT_RE.match(variant)) and ".." not in variant


def read_marker(path: Path) -> dict[str, Any]:
    """The marker's JSON object, read with a cap; PublishError naming the file otherwise."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MARKER_MAX_BYTES + 1)
    except OSError as exc:
        raise PublishError(f"{path}: unreadable index record: {exc.strerror or exc}") from None
    if len(raw) > MARKER_MAX_BYTES:
        raise PublishError(f"{path}: index record over {MARKER_MAX_BYTES // 2**20} MiB")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise PublishError(f"{path}: unreadable index record: {str(exc)[:80]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise PublishError(f"{path}: unreadable index record: no `files` object")
    return data


def checked_records(path: Path, files: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """filename -> the record's fields, each checked (module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for key, rec in files.items():
        where = f"{path}: record {str(key)[:120]!r}"
        if not isinstance(rec, dict) or set(rec) - FIELDS or not set(_STRINGS) <= set(rec):
            raise PublishError(f"{where}: not an index record (fields {', '.join(sorted(FIELDS))})")
        for name in _STRINGS:
            if not isinstance(rec[name], str) or len(rec[name]) > 4096:
                raise PublishError(f"{where}: `{name}` must be a string")
        for name in _OPTIONAL:
            if rec.get(name) is not None and (not isinstance(rec[name], str) or len(rec[name]) > 4096):
                raise PublishError(f"{where}: `{name}` must be a string or null")
        size = rec.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise PublishError(f"{where}: `size` must be a byte count")
        filename = rec["filename"]
        if filename != key or "/" in filename or "\\" in filename:
            raise PublishError(f"{where}: its file name {filename[:120]!r} is not its key")
        try:
            project = parse_wheel_filename(filename)[0]
        except (InvalidWheelFilename, InvalidVersion):
            raise PublishError(f"{where}: {filename[:120]!r} is not a wheel file name") from None
        if rec["version"] != filename.split("-")[1]:
            raise PublishError(f"{where}: version {rec['version'][:60]!r} is not the file name's")
        if rec["project"] != canonicalize_name(project):
            raise PublishError(f"{where}: project {rec['project'][:60]!r} is not the wheel's ({project})")
        if not safe_variant(rec["variant"]):
            raise PublishError(f"{where}: variant {rec['variant'][:60]!r} is not a plain folder name")
        for name in ("sha256", "metadata_sha256"):
            if not _SHA256.match(rec[name]):
                raise PublishError(f"{where}: `{name}` is not a sha256 hex digest")
        out[filename] = rec
    return out
