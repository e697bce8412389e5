"""Serve local pip sources (find-links folders, file:// simple indexes) over HTTP on 127.0.0.1.

`docker build` cannot mount host folders, and copying a multi-GB mirror into a build context is wasteful:
this server exposes the folders read-only, merged into one PEP 503 index at `/simple/`, for the duration
of a build (`--network host`). Optional HTTP basic auth stands in for a private index (the credentials
then reach pip only as a BuildKit `--secret` netrc, never an image layer).
"""

from __future__ import annotations

import base64
import hmac
import html
import re
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

_HREF = re.compile(r'href="([^"]+)"')
_DIST_EXT = (".whl", ".tar.gz", ".zip")


def normalize(name: str) -> str:
    """PEP 503 name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(filename: str) -> str | None:
    """The normalized project of a wheel or sdist file name."""
    if filename.endswith(".whl"):
        return normalize(filename.split("-", 1)[0])
    for ext in (".tar.gz", ".zip"):
        if filename.endswith(ext):
            stem = filename[: -len(ext)]
            return normalize(stem.rsplit("-", 1)[0]) if "-" in stem else None
    return None


@dataclass
class Sources:
    """What to serve: flat folders of distributions and `simple/` index folders."""

    find_links: list[Path] = field(default_factory=list)
    simple_roots: list[Path] = field(default_factory=list)

    def allowed(self, path: Path) -> bool:
        path = path.resolve()
        roots = [p.resolve() for p in self.find_links] + [p.resolve().parent for p in self.simple_roots]
        return any(path == r or r in path.parents for r in roots)

    def projects(self) -> list[str]:
        names: set[str] = set()
        for d in self.find_links:
            for f in d.iterdir() if d.is_dir() else []:
                n = project_of(f.name)
                if n:
                    names.add(n)
        for root in self.simple_roots:
            for d in root.iterdir() if root.is_dir() else []:
                if d.is_dir():
                    names.add(normalize(d.name))
        return sorted(names)

    def links(self, project: str) -> Iterator[tuple[str, Path, str]]:
        """(file name, file path, '#sha256=...' fragment or '') for one project."""
        project = normalize(project)
        for d in self.find_links:
            for f in sorted(d.iterdir()) if d.is_dir() else []:
                if f.is_file() and f.name.endswith(_DIST_EXT) and project_of(f.name) == project:
                    yield f.name, f, ""
        for root in self.simple_roots:
            if not root.is_dir():
                continue
            for d in root.iterdir():
                if not (d.is_dir() and normalize(d.name) == project):
                    continue
                page = d / "index.html"
                if not page.is_file():
                    continue
                for href in _HREF.findall(page.read_text(errors="replace")):
                    url, _, frag = html.unescape(href).partition("#")
                    if urllib.parse.urlparse(url).scheme:
                        continue  # only files of this mirror
                    target = (d / urllib.parse.unquote(url)).resolve()
                    if target.is_file() and self.allowed(target):
                        yield target.name, target, f"#{frag}" if frag else ""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return None

    def _authorized(self) -> bool:
        want = self.server.auth_header
        if want is None:
            return True
        got = self.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode(), want.encode())

    def do_GET(self) -> None:
        if not self._authorized():
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="attnforge-local-index"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = urllib.parse.unquote(urllib.parse.urlparse(self.path).path)
        parts = [p for p in path.split("/") if p]
        src = self.server.sources
        if parts == ["simple"]:
            body = "".join(f'<a href="{n}/">{n}</a>\n' for n in src.projects())
            return self._html(body)
        if len(parts) == 2 and parts[0] == "simple":
            rows = []
            for i, (name, file, frag) in enumerate(src.links(parts[1])):
                self.server.files[f"{normalize(parts[1])}/{i}/{name}"] = file
                rows.append(
                    f'<a href="/files/{normalize(parts[1])}/{i}/{name}{frag}">{html.escape(name)}</a>\n'
                )
            if not rows:
                return self._status(404)
            return self._html("".join(rows))
        if len(parts) == 4 and parts[0] == "files":
            found = self.server.files.get("/".join(parts[1:]))
            if found is None or not found.is_file():
                return self._status(404)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(found.stat().st_size))
            self.end_headers()
            if self.command == "HEAD":
                return None
            with found.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    self.wfile.write(chunk)
            return None
        return self._status(404)

    def do_HEAD(self) -> None:
        self.do_GET()

    def _html(self, body: str) -> None:
        data = f"<!DOCTYPE html><html><body>\n{body}</body></html>\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _status(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    sources: Sources
    auth_header: str | None
    files: dict[str, Path]


class LocalIndexServer:
    """`with LocalIndexServer(sources) as srv: srv.url` -> 'http://127.0.0.1:PORT/simple/'."""

    def __init__(
        self, sources: Sources, *, username: str | None = None, password: str | None = None, port: int = 0
    ) -> None:
        self.sources = sources
        self.username = username
        self.password = password
        self.port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple/"

    @property
    def host(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> LocalIndexServer:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.sources = self.sources
        server.files = {}
        server.auth_header = None
        if self.username is not None and self.password is not None:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            server.auth_header = f"Basic {token}"
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="attnforge-local-index", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
