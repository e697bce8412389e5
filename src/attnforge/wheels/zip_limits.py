"""Reading members of an untrusted wheel with a cap: the size comes from the zip's central directory and
is checked before anything is inflated, and the read itself stops at the cap (a directory that lies about
a member's size cannot make a small archive fill memory)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from attnforge.core.errors import PublishError

METADATA_MAX_BYTES = 16 * 1024 * 1024  # core metadata of real wheels is a few KB; a long README a few 100 KB
MEMBER_MAX_BYTES = 4 * 1024**3  # the largest CUDA library a wheel ships is well under 1 GiB
MAX_RATIO = 200  # deflate compresses real code and libraries 2-10x; a bomb of one byte repeated ~1000x
RATIO_FLOOR = 16 * 1024 * 1024  # small members may compress as they like
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


def check_directory(wheel: Path, zf: zipfile.ZipFile) -> None:
    """Refuse an archive whose directory promises a member over MEMBER_MAX_BYTES, or one inflating more
    than MAX_RATIO times (above RATIO_FLOOR): everything that reads the wheel whole afterwards (twine,
    the RECORD check) is then bounded. Sizes are what the directory says: zipfile stops a member at them."""
    for info in zf.infolist():
        ratio = info.file_size / max(1, info.compress_size)
        if info.file_size > MEMBER_MAX_BYTES or (info.file_size > RATIO_FLOOR and ratio > MAX_RATIO):
            raise PublishError(
                f"{wheel.name}: {info.filename} inflates to {info.file_size:,} bytes from {info.compress_size:,} "
                f"(at most {MEMBER_MAX_BYTES:,} bytes, {MAX_RATIO}x above {RATIO_FLOOR:,}): not a wheel to open"
            )
