"""`attnforge serve`: the static index over HTTP with PEP 691 content negotiation on `Accept`.

Each index folder holds `index.html` (PEP 503) and `index.json` (PEP 691); a request for the folder gets
the one the client prefers: pip sends `application/vnd.pypi.simple.v1+json, ...+html;q=0.1,
text/html;q=0.01` and receives JSON; a browser or an old client receives HTML. `?format=<type>`
overrides Accept (PEP 691's optional query parameter). Everything else is served as plain files.

Only what lies inside the index is served: a path whose real location (symlinks followed) leaves the
index's root gets 404, as does a folder listing. `make_server` serves only a folder that is an attnforge
index (it holds `attnforge-index.json`), and says in one line why it cannot listen.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.publish.index import HTML_TYPE, JSON_TYPE, MARKER

IDLE_TIMEOUT_S = 30.0  # a connection silent this long is closed (pip keeps one alive between requests)

# (media type a client may ask for, file served, Content-Type answered), in the server's preference
_CHOICES: list[tuple[str, str, str]] = [
    (JSON_TYPE, "index.json", JSON_TYPE),
    ("application/vnd.pypi.simple.latest+json", "index.json", JSON_TYPE),
    (HTML_TYPE, "index.html", HTML_TYPE),
    ("application/vnd.pypi.simple.latest+html", "index.html", HTML_TYPE),
    ("text/html", "index.html", "text/html; charset=utf-8"),
]


def parse_accept(header: str | None) -> list[tuple[str, float]]:
    """`a/b;q=0.5, c/d` -> [("a/b", 0.5), ("c/d", 1.0)] (parameters other than q ignored)."""
    if not header or not header.strip():
        return [("text/html", 1.0)]  # PEP 691: no Accept means the HTML API
    out = []
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        if not media:
            continue
        q = 1.0
        for f in fields[1:]:
            key, _, value = f.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = max(0.0, min(1.0, float(value)))
                except ValueError:
                    q = 0.0
        out.append((media, q))
    return out


def negotiate(accept: str | None, available: set[str]) -> tuple[str, str] | None:
    """(file, Content-Type) for an Accept header among the files present; None means 406."""
    best: tuple[float, int, int] | None = None
    chosen: tuple[str, str] | None = None
    for pref, (media, filename, content_type) in enumerate(_CHOICES):
        if filename not in available:
            continue
        for requested, q in parse_accept(accept):
            if q <= 0:
                continue
            if requested == media:
                specificity = 2
            elif requested.endswith("/*") and media.startswith(requested[:-1]):
                specificity = 1
            elif requested == "*/*":
                specificity = 0
            else:
                continue
            # */* gets HTML (what a browser or curl expects); other matches follow our order (JSON first)
            order = -pref if specificity else (-1 if filename == "index.html" else -2)
            score = (q, specificity, order)
            if best is None or score > best:
                best, chosen = score, (filename, content_type)
    return chosen


class IndexHandler(SimpleHTTPRequestHandler):
    """Serves an index folder read-only, negotiating folder pages."""

    server_version = "attnforge-index"
    timeout = IDLE_TIMEOUT_S  # StreamRequestHandler sets it on the socket: every read and write

    log_sink: Callable[[str], None] = staticmethod(lambda m: print(m, file=sys.stderr, flush=True))

    def inside_root(self, local: Path) -> bool:
        """Whether `local`, symlinks followed, is the index root or lies under it (the root itself is
        resolved per request: a publish swaps the generation it points to)."""
        root = os.path.realpath(self.directory)
        real = os.path.realpath(local)
        return real == root or real.startswith(root.rstrip(os.sep) + os.sep)

    def send_head(self) -> Any:
        parts = urlsplit(self.path)
        if "\x00" in unquote(parts.path) or "\x00" in parts.path:
            self.send_error(HTTPStatus.BAD_REQUEST, "bad path")
            return None
        local = Path(self.translate_path(parts.path))
        if not self.inside_root(local):
            self.send_error(HTTPStatus.NOT_FOUND, "not found")
            return None
        if parts.path.endswith("/") and local.is_dir():
            available = {n for n in ("index.json", "index.html") if (local / n).is_file()}
            if "index.json" in available:
                fmt = parse_qs(parts.query).get("format", [None])[0]
                fmt = fmt.replace(" ", "+") if fmt else None  # an unescaped '+' arrives as a space
                choice = negotiate(fmt or self.headers.get("Accept"), available)
                if choice is None:
                    self.send_error(
                        HTTPStatus.NOT_ACCEPTABLE, "supported: " + ", ".join(c[0] for c in _CHOICES)
                    )
                    return None
                filename, content_type = choice
                return self._send_file(local / filename, content_type)
        return super().send_head()

    def _send_file(self, path: Path, content_type: str) -> Any:
        if not self.inside_root(path):
            self.send_error(HTTPStatus.NOT_FOUND, "not found")
            return None
        try:
            fh = path.open("rb")
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "not found")
            return None
        size = os.fstat(fh.fileno()).st_size
        self._served = content_type
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(size))
        self.send_header("Vary", "Accept")
        self.send_header("Cache-Control", "max-age=60")
        self.end_headers()
        return fh

    def log_message(self, format: str, *args: Any) -> None:
        served = getattr(self, "_served", None)
        type(self).log_sink(f"{self.address_string()} {format % args}" + (f" [{served}]" if served else ""))

    def list_directory(self, path: Any) -> Any:
        self.send_error(HTTPStatus.NOT_FOUND, "no index here")
        return None


def index_root(directory: Path) -> Path:
    """`directory` when it is an attnforge index (it holds the marker a publish writes); ConfigurationError
    naming it otherwise, so `serve /etc` serves nothing."""
    if not directory.is_dir():
        raise ConfigurationError(f"{directory}: no index there", hint="attnforge publish --to local")
    if not (directory / MARKER).is_file():
        raise ConfigurationError(
            f"{directory} is not an attnforge index (no {MARKER}): serve the folder `attnforge publish` writes",
            hint="attnforge publish --to local",
        )
    return directory


class IndexServer(ThreadingHTTPServer):
    """A threaded server whose per-connection failures are one log line, never a traceback."""

    request_queue_size = 128  # connections waiting to be accepted (socketserver's default is 5)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            why = "the client went away" if isinstance(exc, ConnectionError) else "the client went silent"
        else:
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        IndexHandler.log_sink(f"{client_address[0] if client_address else '?'} connection ended: {why}")


def make_server(
    directory: Path, host: str = "127.0.0.1", port: int = 0, idle_timeout_s: float = IDLE_TIMEOUT_S
) -> ThreadingHTTPServer:
    """A threaded server for `directory` (a path, followed per request, so a swapped index is seen); a
    connection that sends nothing for `idle_timeout_s` seconds (between requests or inside one) is closed.

    EnvironmentProblem (exit 5) in one line when it cannot listen: the port in use, not allowed, or an
    address this machine does not have."""
    bounded = type("IndexHandler", (IndexHandler,), {"timeout": idle_timeout_s})
    handler = partial(bounded, directory=os.fspath(directory))
    try:
        server = IndexServer((host, port), handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = "the port is in use (another server?): pass --port N, or --port 0 for any free port"
        elif exc.errno == errno.EACCES:
            why = "not allowed to listen there (ports below 1024 need privileges): pass --port N above 1023"
        else:
            why = exc.strerror or str(exc)
        raise EnvironmentProblem(f"cannot serve on {host}:{port}: {why}") from None
    server.daemon_threads = True
    return server
