"""`sdist_url` against a real HTTP server: a PEP 691 JSON page, a PEP 503 HTML page (what PyPI's mirror here
serves even when asked for JSON), a page without the file, garbage, and no server at all."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.matrix.source_lock import sdist_url

SHA = "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"
PAGES: dict[str, tuple[str, bytes]] = {
    "/json/flash-attn/": (
        "application/vnd.pypi.simple.v1+json",
        json.dumps(
            {
                "meta": {"api-version": "1.0"},
                "name": "flash-attn",
                "files": [
                    {
                        "filename": "flash_attn-2.8.2.tar.gz",
                        "url": "../../files/flash_attn-2.8.2.tar.gz",
                        "hashes": {"sha256": "0" * 64},
                    },
                    {
                        "filename": "flash_attn-2.8.3.tar.gz",
                        "url": "https://files.example/flash_attn-2.8.3.tar.gz",
                        "hashes": {"sha256": SHA},
                    },
                ],
            }
        ).encode(),
    ),
    "/html/flash-attn/": (
        "text/html",
        b"<!DOCTYPE html><html><body><h1>Links for flash-attn</h1>"
        b'<a href="../../files/flash_attn-2.8.2.tar.gz#sha256='
        + b"0"
        * 64
        + b'">flash_attn-2.8.2.tar.gz</a><br/>'
        b'<a href="../../files/flash_attn-2.8.3.tar.gz#sha256='
        + SHA.encode()
        + b'">flash_attn-2.8.3.tar.gz</a>'
        b"</body></html>",
    ),
    "/nohash/flash-attn/": ("text/html", b'<a href="/f/flash_attn-2.8.3.tar.gz">flash_attn-2.8.3.tar.gz</a>'),
    "/garbage/flash-attn/": ("application/vnd.pypi.simple.v1+json", b"<html>not json</html>"),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ctype, body = PAGES.get(self.path, ("text/plain", b""))
        self.send_response(200 if self.path in PAGES else 404)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_pep691_json(base: str) -> None:
    assert sdist_url("flash_attn", "2.8.3", f"{base}/json") == (
        "https://files.example/flash_attn-2.8.3.tar.gz",
        SHA,
    )


def test_pep503_html_with_relative_links(base: str) -> None:
    url, sha = sdist_url("flash-attn", "2.8.3", f"{base}/html/")
    assert (url, sha) == (f"{base}/files/flash_attn-2.8.3.tar.gz", SHA)


def test_missing_version_names_the_file(base: str) -> None:
    with pytest.raises(ConfigurationError, match=r"no sdist named flash_attn-2\.9\.9\.tar\.gz"):
        sdist_url("flash-attn", "2.9.9", f"{base}/html")


def test_no_hash_and_garbage_are_environment_errors(base: str) -> None:
    with pytest.raises(EnvironmentProblem, match="without a sha256"):
        sdist_url("flash-attn", "2.8.3", f"{base}/nohash")
    with pytest.raises(EnvironmentProblem, match="not a simple-index page"):
        sdist_url("flash-attn", "2.8.3", f"{base}/garbage")


def test_unreachable_index() -> None:
    with pytest.raises(EnvironmentProblem, match="cannot reach the package index"):
        sdist_url("flash-attn", "2.8.3", "http://127.0.0.1:9/simple")
