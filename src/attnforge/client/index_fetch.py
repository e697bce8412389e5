"""Reading an index's pages (HTTP, HTTPS or a folder) within a time budget, each failure named with its URL:
connection refused, timeout, unreachable host, HTTP status, not found, a response that is not HTTP. `which`
(the project page, manifests, `--verify`'s records) and `doctor` (its yank check and records) read through it.

Every request gets at most `connect_s` seconds to connect and for each read, and all requests of one
`IndexReader` share `total_s` seconds: a server that accepts and never answers costs `connect_s`, not
minutes; inside `shared_deadline` every reader of a command shares one budget too. A user and password in
the URL become an Authorization header and never reach a message (`core.index_urls`); a redirect to another
host (pypiserver's fallback to the public index) is refused. Proxies and CA bundles come from the environment
as for any urllib client.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from attnforge.core.errors import ConfigurationError
from attnforge.core.index_urls import redact_urls, split_auth

CONNECT_TIMEOUT_S = 5.0
TOTAL_BUDGET_S = 30.0
MAX_PAGE_BYTES = 64 * 1024 * 1024  # a project page of 100,000 wheels is ~30 MB of JSON


@dataclass
class _Shared:
    """A command's one budget for reading the index; its clock starts at the first read."""

    seconds: float
    end: float | None = None

    def remaining(self) -> float:
        if self.end is None:
            self.end = time.monotonic() + self.seconds
        return self.end - time.monotonic()


_shared: _Shared | None = None


@contextlib.contextmanager
def shared_deadline(seconds: float) -> Iterator[None]:
    """Inside the block, every IndexReader is bounded by one total of `seconds` as well (counted from the
    first read): a command that reads the index several times (doctor --verify) spends one budget, not one
    per reader."""
    global _shared
    saved, _shared = _shared, _Shared(seconds)
    try:
        yield
    finally:
        _shared = saved


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect within the index's host only: another host is a fallback nobody configured
    (pypiserver's default sends what it lacks to the public index)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        here, there = urlsplit(req.full_url), urlsplit(newurl)
        if there.netloc and there.netloc != here.netloc:
            raise IndexFault(
                "redirect",
                req.full_url,
                f"the index redirects to {there.netloc} (pypiserver's fallback to the public index without "
                "--disable-fallback?); attnforge reads only the index you name",
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_SameHostRedirects)


@dataclass(eq=False)
class IndexFault(Exception):
    """One failed request: `kind` is refused | timeout | unreachable | http | not-found | bad-response |
    bad-url | redirect (to another host)."""

    kind: str
    url: str
    detail: str
    status: int | None = None

    def __post_init__(self) -> None:
        self.url = redact_urls(self.url)  # a user's password or token never reaches a message

    def __str__(self) -> str:
        return f"{self.detail} ({self.url})"

    @property
    def network(self) -> bool:
        """The host could not be talked to at all (other pages of it would fail the same way)."""
        return self.kind in ("refused", "timeout", "unreachable", "bad-response")


@dataclass
class IndexReader:
    """GETs within one budget; `notes` collects faults a caller chose to step over (a missing manifest)."""

    connect_s: float = CONNECT_TIMEOUT_S
    total_s: float = TOTAL_BUDGET_S
    notes: list[str] = field(default_factory=list)
    _deadline: float | None = field(default=None, repr=False)

    shared: bool = True  # bounded by the command's deadline too (`shared_deadline`)

    def remaining(self) -> float:
        if self._deadline is None:
            self._deadline = time.monotonic() + self.total_s
        left = self._deadline - time.monotonic()
        if self.shared and _shared is not None:
            left = min(left, _shared.remaining())
        return left

    def _budget(self) -> float:
        if self.shared and _shared is not None:
            return min(self.total_s, _shared.seconds)
        return self.total_s

    def _timeout(self, url: str) -> float:
        left = self.remaining()
        if left <= 0:
            raise IndexFault(
                "timeout", url, f"the {self._budget():g} s budget for reading the index is spent (--timeout)"
            )
        return min(self.connect_s, left)

    def get(self, url: str, accept: str | None = None, max_bytes: int = MAX_PAGE_BYTES) -> tuple[bytes, str]:
        """(body, Content-Type) of `url`, at most `max_bytes` long; IndexFault naming what went wrong. A
        user and password in the URL go into an Authorization header, never into a message."""
        headers = {"Accept": accept} if accept else {}
        try:
            plain, auth = split_auth(url, "the index URL")
        except ConfigurationError as exc:
            raise IndexFault("bad-url", url, exc.message) from None
        if auth is not None:
            headers["Authorization"] = auth.header()
        req = urllib.request.Request(plain, headers=headers)
        timeout = self._timeout(url)
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                ctype = resp.headers.get("Content-Type", "") if resp.headers else ""
                chunks: list[bytes] = []
                size = 0
                while chunk := resp.read1(256 * 1024):  # what has arrived: a drip cannot stall a read
                    size += len(chunk)
                    if size > max_bytes:
                        raise IndexFault(
                            "bad-response", url, f"the response is larger than {max_bytes:,} bytes"
                        )
                    chunks.append(chunk)
                    self._timeout(url)  # the whole budget bounds a slow drip too
                return b"".join(chunks), ctype
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 410):
                raise IndexFault("not-found", url, f"HTTP {exc.code} {exc.reason}", exc.code) from None
            raise IndexFault("http", url, f"HTTP {exc.code} {exc.reason}", exc.code) from None
        except urllib.error.URLError as exc:
            raise self._fault(url, exc.reason, timeout) from None
        except TimeoutError as exc:
            raise self._fault(url, exc, timeout) from None
        except http.client.HTTPException as exc:
            raise IndexFault("bad-response", url, f"not an HTTP response ({type(exc).__name__})") from None
        except OSError as exc:
            raise self._fault(url, exc, timeout) from None

    @staticmethod
    def _fault(url: str, reason: object, timeout: float) -> IndexFault:
        if isinstance(reason, ConnectionRefusedError):
            return IndexFault("refused", url, "connection refused (is the index server running?)")
        if isinstance(reason, TimeoutError):
            return IndexFault("timeout", url, f"no answer within {timeout:g} s")
        if isinstance(reason, socket.gaierror):
            return IndexFault("unreachable", url, f"unknown host ({reason.strerror or reason})")
        if isinstance(reason, FileNotFoundError):
            return IndexFault("not-found", url, "no such file")
        if isinstance(reason, (ConnectionResetError, http.client.RemoteDisconnected)):
            return IndexFault("bad-response", url, "the server closed the connection without an answer")
        if isinstance(reason, OSError):
            return IndexFault("unreachable", url, reason.strerror or str(reason))
        return IndexFault("unreachable", url, str(reason))
