"""`attnforge serve` stays inside its index; `attnforge which` names every way an index can fail it.

Real HTTP on 127.0.0.1: the index server on a real published index, and small servers that refuse, hang,
drip, answer 5xx/401, send garbage or a corrupt page. Timeouts are shortened through IndexReader so the
suite stays quick; the CLI's own defaults (5 s per connection or read, 30 s in all) are the same code.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from attnforge.client.index_fetch import IndexFault, IndexReader
from attnforge.client.which import fetch_project, resolve
from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.engine.environment import Env
from attnforge.publish.index import StaticIndex
from attnforge.publish.index_server import make_server
from tests.unit.test_wheels_index import make_bundle
from tests.unit.test_wheels_resolver import probe

Run = Callable[..., tuple[int, str, str]]

# ------------------------------------------------------------------------------------------ serve


@pytest.fixture
def published(tmp_path: Path) -> Path:
    """A real index (one wheel), plus a symlinked file and folder that lead out of it."""
    StaticIndex(tmp_path / "index").publish([make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")])
    root = (tmp_path / "index").resolve()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("outside the index\n")
    (root / "evil.whl").symlink_to("/etc/passwd")
    (root / "etcdir").symlink_to("/etc")
    (root / "all" / "simple" / "flash-attn" / "away.whl").symlink_to(tmp_path / "outside" / "secret.txt")
    return tmp_path / "index"


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[str]:
    server = make_server(directory)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def raw_status(base: str, path: str) -> int:
    """The status for a request line sent as it is (no client-side normalization of ../)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        first = s.makefile("rb").readline().decode()
    return int(first.split()[1])


TRAVERSALS = [
    "/../../../../etc/passwd",
    "/..%2f..%2f..%2fetc%2fpasswd",
    "/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/%2E%2E/%2E%2E/etc/passwd",
    "/all/../../../etc/passwd",
    "/all/simple/../../../../etc/passwd",
    "/./../etc/passwd",
    "//etc/passwd",
    "/..\\..\\etc\\passwd",
    "/%252e%252e/%252e%252e/etc/passwd",
    "/....//....//etc/passwd",
    "/.%2e/.%2e/etc/passwd",
    "/%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd",
    "/evil.whl",
    "/etcdir/passwd",
    "/etcdir/",
    "/etcdir",
    "/all/simple/flash-attn/away.whl",
]


def test_serve_answers_nothing_outside_the_index(published: Path) -> None:
    with serving(published) as url:
        assert status(url + "/all/simple/flash-attn/") == 200
        wheel = next((published / "all" / "simple" / "flash-attn").glob("*.whl")).name
        assert status(f"{url}/all/simple/flash-attn/{wheel}") == 200  # a hard link inside: served
        codes = {path: raw_status(url, path) for path in TRAVERSALS}
        assert {p: c for p, c in codes.items() if c not in (301, 400, 404)} == {}
        assert all(c == 404 for p, c in codes.items() if p != "/etcdir")
        assert raw_status(url, "/") in (200, 404)  # the landing page, never a listing of anything else


def test_serve_refuses_a_folder_that_is_not_an_index(tmp_path: Path, run_cli: Run) -> None:
    code, _, err = run_cli("serve", "/etc")
    assert code == 2 and "/etc is not an attnforge index (no attnforge-index.json)" in err
    code, _, err = run_cli("serve", str(tmp_path / "nothing"))
    assert code == 2 and "no index there" in err


def test_serve_on_a_busy_port_is_one_line_exit_5(published: Path, run_cli: Run) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code, _out, err = run_cli("serve", "--port", str(port), str(published))
    assert code == 5 and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"attnforge: error: cannot serve on 127.0.0.1:{port}: the port is in use (another server?): pass "
        "--port N, or --port 0 for any free port"
    ]
    code, _, err = run_cli("serve", "--port", "70000", str(published))
    assert code == 2 and "70000" in err


# ------------------------------------------------------------------------------------------ which


@contextlib.contextmanager
def tcp_server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A listening socket on 127.0.0.1 whose connections `handle` serves, each in a thread."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(32)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def loop() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conns.append(conn)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for c in conns:
            c.close()
        srv.close()


@contextlib.contextmanager
def http_answer(code: int, body: bytes, ctype: str = "application/vnd.pypi.simple.v1+json") -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def quick() -> IndexReader:
    return IndexReader(connect_s=0.5, total_s=2.0)


def fails(url: str, reader: IndexReader | None = None) -> EnvironmentProblem | ConfigurationError:
    with pytest.raises((EnvironmentProblem, ConfigurationError)) as info:
        fetch_project(url, reader=reader or quick())
    assert isinstance(info.value, (EnvironmentProblem, ConfigurationError))
    return info.value


def test_connection_refused_is_named_with_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = fails(f"http://127.0.0.1:{port}")
    assert isinstance(err, EnvironmentProblem) and err.exit_code == 5
    assert str(err) == (
        f"cannot read the index: connection refused (is the index server running?) "
        f"(http://127.0.0.1:{port}/all/simple/flash-attn/)"
    )


def test_a_server_that_never_answers_costs_the_connect_timeout_not_minutes() -> None:
    with tcp_server(lambda conn: time.sleep(30)) as url:
        start = time.monotonic()
        err = fails(url)
        took = time.monotonic() - start
    assert "no answer within 0.5 s" in str(err) and url in str(err)
    assert took < 2.0


def test_a_slow_drip_is_bounded_by_the_total_budget() -> None:
    def drip(conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n")
        with contextlib.suppress(OSError):
            for _ in range(200):
                conn.sendall(b" ")
                time.sleep(0.2)

    with tcp_server(drip) as url:
        start = time.monotonic()
        err = fails(url, IndexReader(connect_s=1.0, total_s=1.5))
        took = time.monotonic() - start
    assert "budget for reading the index is spent" in str(err) and took < 3.0


@pytest.mark.parametrize(
    ("code", "text"),
    [(500, "HTTP 500 Internal Server Error"), (503, "HTTP 503"), (401, "HTTP 401 Unauthorized")],
)
def test_http_status_is_named(code: int, text: str) -> None:
    with http_answer(code, b"no") as url:
        err = fails(url)
    assert isinstance(err, EnvironmentProblem) and text in str(err) and url in str(err)


def test_not_http_at_all() -> None:
    def garbage(conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        conn.close()

    with tcp_server(garbage) as url:
        err = fails(url)
    assert isinstance(err, EnvironmentProblem) and "not an HTTP response" in str(err) and url in str(err)


def test_corrupt_page_is_named() -> None:
    with http_answer(200, b'{"files": [ {"filename": "flash_attn-2.8') as url:
        err = fails(url)
    assert isinstance(err, EnvironmentProblem)
    assert str(err).startswith(f"corrupt index page: {url}/all/simple/flash-attn/: not valid JSON")
    with http_answer(200, b'{"projects": []}') as url:
        assert "JSON without a 'files' list" in str(fails(url))


def test_no_project_page_lists_what_each_url_answered(tmp_path: Path) -> None:
    with http_answer(404, b"") as url:
        err = fails(url)
    assert isinstance(err, ConfigurationError) and err.exit_code == 2
    assert f"{url}/all/simple/flash-attn/ (HTTP 404 Not Found)" in str(err)
    err = fails(str(tmp_path / "none"))
    assert "(no such file)" in str(err)


def test_malformed_entries_are_counted_and_reported(tmp_path: Path) -> None:
    good = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    page = {
        "meta": {"api-version": "1.1"},
        "files": [
            7,
            {"url": "x"},
            {"filename": "flash_attn-notaversion-cp311-cp311-linux_x86_64.whl"},
            {"filename": good.filename, "url": 5},
            {"filename": "flash_attn-2.8.3.tar.gz"},  # an sdist: not a wheel, not malformed
            {"filename": good.filename},
        ],
    }
    with http_answer(200, json.dumps(page).encode()) as url:
        res = resolve(Env.from_probe(probe()), url, reader=quick())
    assert [c.filename for c in res.candidates] == [good.filename]
    assert len(res.malformed) == 4 and res.to_json()["malformed"] == res.malformed
    line = next(x for x in res.explanation if x.startswith("index: "))
    assert line.startswith(
        f"index: 4 malformed entries of {url}/all/simple/flash-attn/ skipped: files[0]: not an object"
    )


def test_an_unreadable_manifest_is_a_note(tmp_path: Path) -> None:
    reader = quick()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    good = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    page = {"files": [{"filename": good.filename, "url": f"http://127.0.0.1:{port}/{good.filename}"}]}
    with http_answer(200, json.dumps(page).encode()) as url:
        gpus = [{"name": "H100", "capability": [9, 0]}]
        res = resolve(Env.from_probe(probe(gpus=gpus)), url, reader=reader)
    assert any(
        line.startswith(f"note: manifest of {good.filename} not read: connection refused")
        for line in res.explanation
    )


def test_index_fault_kinds_are_distinct() -> None:
    assert IndexFault("refused", "u", "d").network and not IndexFault("not-found", "u", "d").network


# ------------------------------------------------------------------------------------------ which --verify, doctor


def test_verify_reads_the_records_within_the_same_budget(tmp_path: Path) -> None:
    """`which --verify`: the records beside the chosen wheel are read as the page is, within one budget."""
    from attnforge.client.record_check import offered, verify_offered

    good = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    with tcp_server(lambda conn: time.sleep(30)) as hanging:
        entry = {
            "filename": good.filename,
            "url": f"{hanging}/{good.filename}",
            "hashes": {"sha256": "ab" * 32},
        }
        with http_answer(200, json.dumps({"files": [7, entry]}).encode()) as url:
            reader = quick()
            wheel = offered(url, "flash-attn", lambda name: name == good.filename, reader)
            start = time.monotonic()
            with pytest.raises(EnvironmentProblem) as info:
                verify_offered(wheel, [], reader)
            took = time.monotonic() - start
    assert str(info.value) == (
        f"cannot read the index: no answer within 0.5 s ({hanging}/{good.filename}.manifest.json)"
    )
    assert took < 2.0


def test_doctor_yank_check_names_what_went_wrong(tmp_path: Path) -> None:
    """`doctor --index-url`: an unreadable index is a skip naming why; malformed entries beside a yanked
    file do not hide the yank."""
    from attnforge.client.yank_status import yank_check

    env = Env.from_probe(probe())
    good = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    version = good.filename.split("-")[1]
    with http_answer(503, b"down") as url:
        down = yank_check(url, "flash-attn", version, env, quick())
    assert down.status == "skip" and down.detail.startswith(
        "index not readable: cannot read the index: HTTP 503"
    )
    page = {"files": [7, {"url": "x"}, {"filename": good.filename, "yanked": "wrong results"}]}
    with http_answer(200, json.dumps(page).encode()) as url:
        warn = yank_check(url, "flash-attn", version, env, quick())
        res = resolve(env, url, reader=quick())
    assert warn.status == "warn" and "wrong results" in warn.detail
    assert res.yanked == {good.filename: "wrong results"} and len(res.malformed) == 2 and res.choice is None
