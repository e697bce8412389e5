"""Reading wheel members through HTTP range requests (attnforge.wheels.remote) from a loopback server."""

from __future__ import annotations

import http.server
import io
import threading
import zipfile
from collections.abc import Iterator
from typing import ClassVar

import pytest

from attnforge.errors import EnvironmentProblem
from attnforge.wheels.remote import read_members


def _archive() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("torch/include/ATen/cuda/PhiloxCudaState.h", "#pragma once\n")
        for n in range(100):  # 6.4 MB of which only the central directory and one member are read
            zf.writestr(f"torch/lib/filler{n}.bin", bytes(range(256)) * 256, zipfile.ZIP_STORED)
    return buf.getvalue()


class _Handler(http.server.BaseHTTPRequestHandler):
    payload = b""
    honour_ranges = True
    served: ClassVar[list[int]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        spec = self.headers.get("Range", "")
        if self.honour_ranges and spec.startswith("bytes="):
            start, end = (int(x) for x in spec[len("bytes=") :].split("-"))
            body = self.payload[start : end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(self.payload)}")
        else:
            body = self.payload
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.served.append(len(body))


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("H", (_Handler,), {"payload": _archive(), "served": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/torch.whl", handler
    finally:
        srv.shutdown()


def test_reads_one_member_without_the_whole_archive(server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    got = read_members(url, ["torch/include/ATen/cuda/PhiloxCudaState.h"])
    assert got == {"torch/include/ATen/cuda/PhiloxCudaState.h": b"#pragma once\n"}
    assert sum(handler.served) < 100_000 < len(handler.payload), (sum(handler.served), len(handler.payload))


def test_a_missing_member_or_a_server_without_ranges_is_an_environment_problem(
    server: tuple[str, type[_Handler]],
) -> None:
    url, handler = server
    with pytest.raises(EnvironmentProblem, match="no torch/include/nope.h in the archive"):
        read_members(url, ["torch/include/nope.h"])
    handler.honour_ranges = False
    with pytest.raises(EnvironmentProblem, match="answered 200, not 206"):
        read_members(url, ["torch/include/ATen/cuda/PhiloxCudaState.h"])
