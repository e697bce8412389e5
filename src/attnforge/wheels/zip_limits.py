"""Reading members of an untrusted wheel with a cap: the size comes from the zip's central directory and
is checked before anything is inflated, and the read itself stops at the cap (a directory that lies about
a member's size cannot make a small archive fill memory)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from attnforge.core.errors import PublishError

METADATA_MAX_BYTES = 16 * 1024 * 1024  # core metadata of real wheels is a few KB; a long README a few 100 KB
_CHUNK = 1024 * 1024


def read_member(wheel: Path, zf: zipfile.ZipFile, name: str, cap: int = METADATA_MAX_BYTES) -> bytes:
    """The bytes of `name` in `zf` (the archive `wheel`), refused with PublishError when its directory
    entry or its inflated bytes exceed `cap`."""
    info = zf.getinfo(name)
    if info.file_size > cap:
        raise PublishError(
            f"{wheel.name}: {name} inflates to {info.file_size:,} bytes, over the {cap:,} a member may hold"
        )
    out = bytearray()
    with zf.open(info) as fh:
        while chunk := fh.read(min(_CHUNK, cap + 1 - len(out))):
            out += chunk
            if len(out) > cap:
                raise PublishError(f"{wheel.name}: {name} inflates past the {cap:,} bytes a member may hold")
    return bytes(out)
