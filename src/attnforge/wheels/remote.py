"""Members of a wheel on a package index, read through HTTP range requests: the zip's central directory and
the members asked for, not the whole file (three headers of an 800 MB torch wheel take about six requests).

`torch_headers(version)` keeps the few torch headers attnforge's own headers compile against (the Philox
state's, `PHILOX_HEADERS`) in a per-user cache, so a check against every torch release of the matrix pays
the index once (docs/build-internals.md, "The kernel units without torch").
"""

from __future__ import annotations

import io
import json
import os
import ssl
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable
from pathlib import Path

from ..builder.files import atomic_write_bytes, atomic_write_text
from ..errors import EnvironmentProblem
from ..matrix.lock import PYPI_SIMPLE, simple_files

# What attnforge_philox_torch.h includes from torch, and torch's own unpack (to compare conversions with).
PHILOX_HEADERS = (
    "ATen/cuda/PhiloxCudaState.h",
    "ATen/cuda/detail/PhiloxCudaStateRaw.cuh",
    "ATen/cuda/detail/UnpackRaw.cuh",
)
_TIMEOUT = 60


def _ssl_context() -> ssl.SSLContext:
    """The system's trust store, or the CA bundle pip is told to use (an intercepting proxy's)."""
    cafile = next((os.environ[k] for k in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE")
                   if os.environ.get(k) and Path(os.environ[k]).is_file()), None)  # fmt: skip
    return ssl.create_default_context(cafile=cafile)


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file: each read is one HTTP range request."""

    def __init__(self, url: str, context: ssl.SSLContext | None = None) -> None:
        super().__init__()
        self.url = url
        self.requests = 0
        self._ctx = context or _ssl_context()
        self._pos = 0
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=_TIMEOUT, context=self._ctx) as resp:
            length = resp.headers.get("Content-Length")
            ranges = resp.headers.get("Accept-Ranges", "")
        if length is None or ranges.strip().lower() == "none":
            raise EnvironmentProblem(f"{url}: the server gives no size or refuses range requests")
        self.size = int(length)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._pos >= self.size or not len(view):
            return 0
        end = min(self._pos + len(view), self.size) - 1
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self._pos}-{end}"})
        with urllib.request.urlopen(req, timeout=_TIMEOUT, context=self._ctx) as resp:
            if resp.status != 206:  # a 200 would be the whole file
                raise EnvironmentProblem(f"{self.url}: range request answered {resp.status}, not 206")
            data = resp.read()
        self.requests += 1
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def read_members(url: str, names: Iterable[str], context: ssl.SSLContext | None = None) -> dict[str, bytes]:
    """The named members of the zip at `url` (each checked against its CRC by zipfile). A missing one is an
    EnvironmentProblem naming it."""
    try:
        raw = RangeFile(url, context)
        with zipfile.ZipFile(io.BufferedReader(raw, buffer_size=1 << 16)) as zf:
            have = set(zf.namelist())
            missing = [n for n in names if n not in have]
            if missing:
                raise EnvironmentProblem(f"{url}: no {', '.join(missing)} in the archive")
            return {n: zf.read(n) for n in names}
    except (urllib.error.URLError, TimeoutError, OSError, zipfile.BadZipFile) as exc:
        raise EnvironmentProblem(f"cannot read {url}: {exc}") from None


def wheel_url(
    project: str, version: str, platform: str = "manylinux", index: str = PYPI_SIMPLE
) -> tuple[str, str]:
    """(file name, URL) of a Linux x86_64 wheel of project==version on a simple index (PEP 691 or 503)."""
    page_url = f"{index.rstrip('/')}/{project}/"
    req = urllib.request.Request(
        page_url, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}
    )
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT, context=_ssl_context()) as resp:
            body, ctype = resp.read(), resp.headers.get("Content-Type", "")
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise EnvironmentProblem(f"cannot reach the package index {index}: {exc}") from None
    prefix = f"{project.replace('-', '_')}-{version}-"
    for filename, url, _sha in simple_files(body, ctype, page_url):
        if filename.startswith(prefix) and platform in filename and filename.endswith("_x86_64.whl"):
            return filename, url
    raise EnvironmentProblem(f"{page_url}: no {platform} x86_64 wheel of {project} {version}")


def headers_cache() -> Path:
    """$ATTNFORGE_TORCH_HEADERS, else <user cache>/attnforge/torch-headers."""
    env = os.environ.get("ATTNFORGE_TORCH_HEADERS")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnforge" / "torch-headers"


def torch_headers(version: str, names: Iterable[str] = PHILOX_HEADERS, cache: Path | None = None) -> Path:
    """An include folder holding torch==version's `names` (paths below torch/include), read from its PyPI wheel
    once and kept under `cache` (default `headers_cache()`) with `source.json` naming the wheel."""
    wanted = list(names)
    top = (cache or headers_cache()) / version
    include = top / "include"
    if all((include / n).is_file() for n in wanted):
        return include
    filename, url = wheel_url("torch", version)
    members = read_members(url, [f"torch/include/{n}" for n in wanted])
    for name in wanted:
        atomic_write_bytes(include / name, members[f"torch/include/{name}"])
    atomic_write_text(
        top / "source.json", json.dumps({"wheel": filename, "url": url, "headers": wanted}, indent=2)
    )
    return include
