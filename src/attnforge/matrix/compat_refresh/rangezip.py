"""Members of a wheel on a package index read through HTTP range requests: the zip's central directory and the
members asked for, never the whole file (a few headers of an 800 MB torch wheel take a few requests)."""

from __future__ import annotations

import io
import ssl
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable

from attnforge.core.errors import EnvironmentProblem

_BLOCK = 256 * 1024
_TIMEOUT = 60


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file: each read is an HTTP `Range` request (blocks cached)."""

    def __init__(self, url: str, context: ssl.SSLContext | None, timeout: float = _TIMEOUT) -> None:
        super().__init__()
        self.url, self.context, self.timeout = url, context, timeout
        self.pos = 0
        self.blocks: dict[int, bytes] = {}
        self.size = self._size()

    def _get(self, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        req = urllib.request.Request(self.url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                return resp.read(), dict(resp.headers.items())
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise EnvironmentProblem(f"cannot read {self.url}: {exc}") from None

    def _size(self) -> int:
        _, headers = self._get({"Range": "bytes=0-0"})
        total = {k.lower(): v for k, v in headers.items()}.get("content-range", "").rpartition("/")[2]
        if not total.isdigit():
            raise EnvironmentProblem(f"{self.url}: the server answers no byte ranges (Content-Range)")
        return int(total)

    def _block(self, n: int) -> bytes:
        if n not in self.blocks:
            start = n * _BLOCK
            end = min(start + _BLOCK, self.size) - 1
            body, _ = self._get({"Range": f"bytes={start}-{end}"})
            self.blocks[n] = body
        return self.blocks[n]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, size: int | None = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self.pos + size)
        out = bytearray()
        while self.pos < end:
            n, skip = divmod(self.pos, _BLOCK)
            chunk = self._block(n)[skip : skip + (end - self.pos)]
            if not chunk:
                break
            out += chunk
            self.pos += len(chunk)
        return bytes(out)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def read_members(url: str, names: Iterable[str], context: ssl.SSLContext | None) -> dict[str, bytes | None]:
    """The named members of the zip at `url` (None for a name the archive lacks)."""
    try:
        with zipfile.ZipFile(RangeFile(url, context)) as zf:
            have = set(zf.namelist())
            return {n: zf.read(n) if n in have else None for n in names}
    except zipfile.BadZipFile as exc:
        raise EnvironmentProblem(f"{url}: not a zip archive: {exc}") from None
