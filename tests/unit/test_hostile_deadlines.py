"""Hostile servers and leaked secrets, second pass: every network wait under a total deadline that its error
names, no redirect to a host nobody configured, `serve` that lets go of idle and hostile clients in one log
line, and index passwords and tokens kept out of every output.

Real parts: servers on 127.0.0.1 (small socket servers that drip or hang, `attnforge serve`'s own server,
a real pypiserver started without --disable-fallback), the real CLI, a real pip.conf read by `pip config list`.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnforge.client.index_fetch import IndexFault, IndexReader, shared_deadline
from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.core.index_urls import config_values, redact_urls, split_auth
from attnforge.engine.backends.pip_config import pip_options
from attnforge.matrix.destinations import Credentials
from attnforge.matrix.schema import PipSpec
from attnforge.publish.index import StaticIndex
from attnforge.publish.index_server import IndexHandler, make_server
from attnforge.publish.server_deadline import Deadline
from attnforge.publish.upload import publish_to_server
from tests.unit.test_hostile_network import tcp_server
from tests.unit.test_wheels_index import make_bundle

Run = Callable[..., tuple[int, str, str]]
PASSWORD = "Tr1al-pw-7d1e4c"  # the trial passwords: no output file of these tests may hold them
TOKEN = "Tr1al-tok-93ab5f"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------ publish: one deadline


@contextlib.contextmanager
def upload_server(on_post: Callable[[http.server.BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """A server that has no project yet (404 on the simple page) and answers uploads with `on_post`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            on_post(self)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def drip_answer(handler: http.server.BaseHTTPRequestHandler) -> None:
    """Headers, then one byte a second for a minute."""
    handler.send_response(200)
    handler.send_header("Content-Length", "60")
    handler.end_headers()
    with contextlib.suppress(OSError):
        for _ in range(60):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(1)


def test_an_upload_to_a_dripping_server_stops_at_its_deadline(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    with upload_server(drip_answer) as url:
        start = time.monotonic()
        with pytest.raises(PublishError) as err:
            publish_to_server(
                url, Credentials("u", PASSWORD), [bundle], lambda m: None, deadline=Deadline(3.0, "--timeout")
            )
        took = time.monotonic() - start
    assert f"upload of {bundle.filename} to {url}: not done within the 3 s deadline (--timeout)" in str(
        err.value
    )
    assert 2.5 < took < 6.0, took
    assert PASSWORD not in str(err.value)


def test_a_listing_that_drips_stops_at_the_deadline(tmp_path: Path) -> None:
    def drip(conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        with contextlib.suppress(OSError):
            for _ in range(100):
                conn.sendall(b"<")
                time.sleep(0.5)

    bundle = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    with tcp_server(drip) as url:
        start = time.monotonic()
        with pytest.raises(
            PublishError, match=r"GET .*/simple/flash-attn/: not done within the 2 s deadline"
        ):
            publish_to_server(
                url, Credentials(None), [bundle], lambda m: None, deadline=Deadline(2.0, "--timeout")
            )
        assert time.monotonic() - start < 4.0


def test_a_server_that_never_answers_costs_the_deadline_named(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    with tcp_server(lambda conn: time.sleep(30)) as url:
        start = time.monotonic()
        with pytest.raises(PublishError, match=r"GET .*: not done within the 2 s deadline \(--timeout\)"):
            publish_to_server(
                url, Credentials(None), [bundle], lambda m: None, deadline=Deadline(2.0, "--timeout")
            )
        assert time.monotonic() - start < 4.0


def test_publish_cli_names_its_timeout(tmp_path: Path, run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_cli("publish", "--help")
    assert code == 0 and "--timeout" in err + _ and "ATTNFORGE_PUBLISH_TIMEOUT" in err + _
    monkeypatch.setenv("ATTNFORGE_PUBLISH_TIMEOUT", "soon")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("publish", "--to", str(tmp_path / "x"))
    assert code == 2 and "Traceback" not in err and "--timeout" in err


# ------------------------------------------------------------------------------ fallback to the public index


@pytest.fixture
def fallback_pypiserver(tmp_path: Path) -> Iterator[str]:
    """A default pypiserver (no --disable-fallback): a project it lacks redirects to pypi.org."""
    from tests.integration.wheelfactory import VENV_BIN, Served, free_port, wait_for

    (tmp_path / "packages").mkdir()
    port = free_port()
    cmd: list[str | Path] = [
        VENV_BIN / "pypi-server",
        "run",
        "-i",
        "127.0.0.1",
        "-p",
        str(port),
        "-a",
        ".",
        "-P",
        ".",
    ]
    served = Served([*cmd, "--server", "wsgiref", tmp_path / "packages"], tmp_path / "pypiserver.log")
    try:
        wait_for(f"http://127.0.0.1:{port}/simple/")
        yield f"http://127.0.0.1:{port}/"
    finally:
        served.stop()


def test_a_default_pypiserver_is_named_and_never_followed_to_pypi(
    tmp_path: Path, fallback_pypiserver: str
) -> None:
    bundle = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    start = time.monotonic()
    with pytest.raises(PublishError) as err:
        publish_to_server(fallback_pypiserver, Credentials(None), [bundle], lambda m: None)
    assert "redirects to pypi.org for a project it does not hold" in err.value.message
    assert "start the server with --disable-fallback" in err.value.message
    assert time.monotonic() - start < 5
    with pytest.raises(IndexFault) as fault:
        IndexReader(connect_s=2, total_s=5).get(fallback_pypiserver + "simple/flash-attn/")
    assert fault.value.kind == "redirect" and "redirects to pypi.org" in str(fault.value)


# ------------------------------------------------------------------------------ doctor: one budget


def test_readers_of_one_command_share_one_budget() -> None:
    def drip(conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n")
        with contextlib.suppress(OSError):
            for _ in range(100):
                conn.sendall(b" ")
                time.sleep(0.2)

    with shared_deadline(1.5), tcp_server(drip) as url:
        start = time.monotonic()
        for _ in range(2):  # doctor's yank check, then --verify's records: each its own reader
            with pytest.raises(
                IndexFault, match=r"the 1.5 s budget for reading the index is spent \(--timeout\)"
            ):
                IndexReader(connect_s=1.0).get(url)
        assert time.monotonic() - start < 2.5


# ------------------------------------------------------------------------------ serve


@contextlib.contextmanager
def serving(directory: Path, idle: float) -> Iterator[tuple[int, list[str]]]:
    lines: list[str] = []
    server = make_server(directory, idle_timeout_s=idle)
    saved = IndexHandler.log_sink
    IndexHandler.log_sink = staticmethod(lines.append)  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), lines
    finally:
        server.shutdown()
        server.server_close()
        IndexHandler.log_sink = saved  # type: ignore[method-assign]


@pytest.fixture
def index(tmp_path: Path) -> Path:
    big = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE", body=os.urandom(4 << 20))
    StaticIndex(tmp_path / "index").publish([big])
    return tmp_path / "index"


def raw(port: int, request: bytes, timeout: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        return s.recv(200)


def test_serve_answers_a_nul_path_and_lets_go_of_idle_and_vanishing_clients(index: Path) -> None:
    with serving(index, idle=0.5) as (port, lines):
        assert raw(port, b"GET /a%00b HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 400")
        assert raw(port, b"GET /a\x00b HTTP/1.0\r\n\r\n").split(b" ")[1] in (b"400", b"404")
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        time.sleep(1.5)
        closed = 0
        for conn in idle:
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                closed += conn.recv(1) == b""
            conn.close()
        assert closed == 20  # every silent connection was let go at the idle timeout
        wheel = next((index / "all" / "simple" / "flash-attn").glob("*.whl")).name
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(f"GET /all/simple/flash-attn/{wheel} HTTP/1.0\r\n\r\n".encode())
        conn.recv(1000)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        conn.close()  # a reset mid-download
        time.sleep(0.5)
    text = "\n".join(lines)
    assert "Traceback" not in text and "embedded null byte" not in text
    assert any("connection ended: the client went away" in line or '"GET /all' in line for line in lines)


# ------------------------------------------------------------------------------ index passwords and tokens


@settings(max_examples=60, deadline=None)
@given(
    password=st.text(
        alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/?#@[]\\"),
        min_size=8,
        max_size=30,
    ),
    user=st.text(alphabet="abcdefgh-_.", min_size=1, max_size=8),
)
def test_every_spelling_of_an_index_password_is_split_off_and_redacted(password: str, user: str) -> None:
    quoted = urllib.parse.quote(password, safe="")
    url = f"https://{user}:{quoted}@pypi.internal:8443/simple/"
    clean, auth = split_auth(url, "--index-url")
    assert auth is not None and auth.password == password and auth.user == user
    assert clean == "https://pypi.internal:8443/simple/" and "password='***'" in repr(auth)
    for text in (url, f"cannot read {url}index.json (x)", f"pip install x --index-url {url}"):
        shown = redact_urls(text)
        assert quoted not in shown and "pypi.internal:8443" in shown


@pytest.mark.parametrize("param", ["token", "api_key", "access_token", "X-Amz-Signature"])
def test_query_string_tokens_are_refused_by_name_never_shown(param: str) -> None:
    url = f"https://pypi.internal/simple/?{param}={TOKEN}"
    with pytest.raises(ConfigurationError) as err:
        split_auth(url, "--index-url")
    assert f"({param}=...)" in err.value.message and TOKEN not in err.value.message
    assert TOKEN not in redact_urls(f"GET {url} failed")


def test_which_and_doctor_never_print_an_index_password(
    tmp_path: Path, run_cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    port = closed_port()
    url = f"http://forge:{PASSWORD}@127.0.0.1:{port}/"
    outputs = []
    for args in (
        ("which", "--index-url", url, "--timeout", "2"),
        ("doctor", "--index-url", url, "--verify", "--timeout", "2"),
    ):
        code, out, err = run_cli(*args)
        outputs.append(out + err)
        assert code in (5, 7), (args, out, err)
    monkeypatch.setenv("ATTNFORGE_INDEX_URL", url)
    code, out, err = run_cli("which", "--timeout", "2")
    outputs.append(out + err)
    assert code == 5 and "connection refused" in err and f"http://***@127.0.0.1:{port}/" in err, err
    assert "unknown host" not in err
    monkeypatch.setenv("ATTNFORGE_INDEX_URL", f"http://127.0.0.1:{port}/simple/?token={TOKEN}")
    code, out, err = run_cli("which")
    outputs.append(out + err)
    assert code == 2 and "(token=...)" in err and "$ATTNFORGE_INDEX_URL" in err
    log = tmp_path / "which-doctor-output.txt"  # what the trials keep: it must hold no trial secret
    log.write_text("\n".join(outputs))
    assert PASSWORD not in log.read_text() and TOKEN not in log.read_text()


def test_an_index_url_with_credentials_is_read_with_basic_auth(tmp_path: Path) -> None:
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization") or "")
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        body, _ = IndexReader().get(f"http://forge:{PASSWORD}@127.0.0.1:{server.server_address[1]}/simple/")
    finally:
        server.shutdown()
        server.server_close()
    import base64

    assert body == b"{}" and seen == ["Basic " + base64.b64encode(f"forge:{PASSWORD}".encode()).decode()]


def test_pip_conf_urls_over_several_lines_are_each_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\n"
        "extra-index-url =\n"
        f"    http://one:{PASSWORD}@127.0.0.1:9/simple/\n"
        f"    http://two:{PASSWORD}x@127.0.0.2:9/simple/\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    opts = pip_options(PipSpec())  # the real `pip config list`
    pairs = list(zip(opts.args[::2], opts.args[1::2], strict=True))
    assert [v for k, v in pairs if k == "--extra-index-url"] == [
        "http://127.0.0.1:9/simple/",
        "http://127.0.0.2:9/simple/",
    ]
    assert [(login.host, login.login) for login in opts.logins] == [
        ("127.0.0.1", "one"),
        ("127.0.0.2", "two"),
    ]
    assert PASSWORD not in " ".join(opts.args) + " ".join(opts.notes) + repr(opts)
    assert config_values("'http://a/simple\\nhttp://b/simple'") == ["http://a/simple", "http://b/simple"]
    conf.write_text(f"[global]\nindex-url = https://127.0.0.1/simple/?token={TOKEN}\n")
    with pytest.raises(ConfigurationError) as err:
        pip_options(PipSpec())
    assert "this machine's pip config (index-url)" in err.value.message and TOKEN not in err.value.message


def test_a_token_in_matrix_yaml_or_records_url_is_refused(
    tmp_path: Path, run_cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnforge.matrix.file import parse_matrix
    from tests.unit.test_hostile_trust import GOOD

    text = GOOD + f'build: {{pip: {{extra_index_urls: ["https://x.internal/simple/?token={TOKEN}"]}}}}\n'
    with pytest.raises(ConfigurationError) as err:
        parse_matrix(text, "matrix.yaml")
    assert "entry 0 carries credentials" in err.value.message and TOKEN not in err.value.message
    monkeypatch.chdir(tmp_path)
    code, out, err_text = run_cli("which", "--records-url", f"http://127.0.0.1:9/r/?api_key={TOKEN}")
    assert (
        code == 2 and "--records-url (or $ATTNFORGE_RECORDS_URL)" in err_text and TOKEN not in out + err_text
    )
