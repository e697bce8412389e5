"""One total deadline for a conversation with an index server, and bounded reads under it.

A server that accepts and never answers, or sends its headers and then one byte a second, cannot hold a
publish: every request gets at most the time left, a body is read as it arrives (`read1`) with the clock
checked between pieces and a size cap, and the upload itself runs in a child process that is stopped at
the deadline. Each refusal names the deadline and the option that sets it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from attnforge.core.errors import PublishError

DEFAULT_TIMEOUT_S = 1800.0  # a 1 GB wheel at ~1 MB/s, with room
CONNECT_S = 10.0
READ_S = 60.0
MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass
class Deadline:
    """`seconds` from the first use; `what` names the setting in errors."""

    seconds: float = DEFAULT_TIMEOUT_S
    what: str = "publish --timeout"
    _end: float | None = field(default=None, repr=False)

    def remaining(self) -> float:
        if self._end is None:
            self._end = time.monotonic() + self.seconds
        return self._end - time.monotonic()

    def expired(self, doing: str) -> PublishError:
        return PublishError(f"{doing}: not done within the {self.seconds:g} s deadline ({self.what})")

    def left(self, doing: str) -> float:
        """Seconds left; PublishError when none are."""
        left = self.remaining()
        if left <= 0:
            raise self.expired(doing)
        return left


def fallback_host(url: str, location: str | None) -> str | None:
    """The other host a redirect from `url` leads to (pypiserver's fallback to the public index), or None."""
    if not location:
        return None
    here, there = urlsplit(url), urlsplit(location)
    return there.netloc if there.netloc and there.netloc != here.netloc else None


def bounded_request(
    session: Any, method: str, url: str, deadline: Deadline, *, max_bytes: int = MAX_BODY_BYTES, **kw: Any
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request within `deadline` (redirects not followed: the caller
    decides); PublishError on the deadline, a silent server or an oversized body; requests' other errors
    pass through."""
    import requests

    doing = f"{method} {url}"
    left = deadline.left(doing)
    try:
        resp = session.request(
            method,
            url,
            stream=True,
            allow_redirects=False,
            timeout=(min(CONNECT_S, left), min(READ_S, left)),
            **kw,
        )
    except requests.RequestException as exc:
        if deadline.remaining() < 1.0:
            raise deadline.expired(doing) from None
        if isinstance(exc, requests.Timeout):
            raise PublishError(f"{doing}: no answer within {min(READ_S, left):.0f} s") from None
        raise
    try:
        body = bytearray()
        while True:
            deadline.left(doing)
            chunk = resp.raw.read1(64 * 1024)
            if not chunk:
                break
            body += chunk
            if len(body) > max_bytes:
                raise PublishError(f"{doing}: the answer is larger than {max_bytes:,} bytes")
        return resp.status_code, dict(resp.headers), bytes(body)
    finally:
        resp.close()
