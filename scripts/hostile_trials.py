"""Hostile-input trials, second pass: each a real `attnforge` process against hostile files or a hostile server
on 127.0.0.1, measured (exit code, wall time, peak resident memory by wait4), written as the table between
the `hostile-trials` markers of reports/reliability.md.

    PYTHONPATH=src python scripts/hostile_trials.py [--work DIR] [--report reports/reliability.md]

Afterwards every file the trials wrote (their logs, outputs and the report) is searched for the trial
passwords and token; finding one fails the run (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import http.server
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.unit.test_wheels_index import make_bundle  # noqa: E402

from attnforge.core.index_urls import redact_urls  # noqa: E402

PASSWORD = "Tr1al-pw-7d1e4c"
TOKEN = "Tr1al-tok-93ab5f"
BEGIN, END = "<!-- hostile-trials:begin -->", "<!-- hostile-trials:end -->"
MATRIX = """\
version: 1
kernels:
  flash-attn: {{version: "2.8.3"}}
targets:
  t:
    matrix: {{toolkit: [cuda12.8], torch: ["2.8"], python: ["3.12"], arch: [sm_90]}}
destinations:
  drip: {{kind: pypiserver, url: "{url}"}}
"""


@dataclass
class Row:
    trial: str
    command: str
    code: int
    seconds: float
    peak_mb: float
    said: str


# Runs a command as its grandchild and writes its peak RSS (KB): a process forked from this (large) one would
# report this one's memory as its own peak (Linux carries the pre-exec high-water mark into ru_maxrss).
LAUNCHER = """
import os, signal, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
signal.signal(signal.SIGTERM, lambda n, f: os.kill(pid, n))
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def launch(cmd: list[str], rss: Path, **kw: Any) -> subprocess.Popen[Any]:
    """`cmd` through LAUNCHER (its peak RSS in KB lands in `rss`), in a process group of its own."""
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, str(rss), *cmd], start_new_session=True, **kw)


def peak_mb(rss: Path) -> float:
    return int(rss.read_text() or 0) / 1024 if rss.is_file() else float("nan")


def run(
    args: list[str], cwd: Path, log: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> Row:
    """One `attnforge ARGS` process in `cwd`, measured; its stderr and stdout kept in `log`."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]), **(env or {})}
    cmd = [sys.executable, "-m", "attnforge.cli", *args]
    rss = log.with_suffix(".rss")
    start = time.monotonic()
    with log.open("w") as fh:
        proc = launch(cmd, rss, cwd=cwd, env=full, stdout=fh, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if time.monotonic() - start > timeout:
                os.killpg(proc.pid, 9)
            time.sleep(0.01)
    seconds = time.monotonic() - start
    text = log.read_text()
    said = next(
        (line for line in reversed(text.splitlines()) if "error" in line or "fail" in line), text[-200:]
    )
    shown = "attnforge " + " ".join(a if len(a) < 80 else a[:40] + "..." for a in args)
    return Row("", redact_urls(shown), proc.returncode, seconds, peak_mb(rss), redact_urls(said.strip()))


@contextlib.contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class Drip(http.server.BaseHTTPRequestHandler):
    """No project yet (404); an upload or any other page gets its headers, then one byte a second."""

    def _drip(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "600")
        self.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(600):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1)

    def do_GET(self) -> None:
        self._drip()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._drip()

    def log_message(self, *args: Any) -> None:
        pass


class UploadDrip(Drip):
    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


def wheel_set(folder: Path, local: str = "cu130torch2.14cxx11abiTRUE") -> Any:
    b = make_bundle(folder, local)
    b.wheel.with_name(b.wheel.name + ".manifest.json").write_text(json.dumps(b.manifest))
    return b


def zip_bomb(folder: Path, inflated: int) -> Path:
    b = make_bundle(folder, "cu130torch2.14cxx11abiTRUE")
    bomb = b.wheel.with_suffix(".tmp")
    with zipfile.ZipFile(b.wheel) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.endswith("/METADATA"):
                with dst.open(info.filename, "w", force_zip64=True) as fh:
                    fh.write(src.read(info).rstrip(b"\n") + b"\nDescription: ")
                    block = b" " * (1 << 20)
                    for _ in range(inflated >> 20):
                        fh.write(block)
            else:
                dst.writestr(info.filename, src.read(info))
    bomb.replace(b.wheel)
    data = b.wheel.read_bytes()
    b.manifest.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    b.wheel.with_name(b.wheel.name + ".manifest.json").write_text(json.dumps(b.manifest))
    return b.wheel


def trials(work: Path) -> list[Row]:
    rows: list[Row] = []

    def add(name: str, row: Row) -> None:
        row.trial = name
        rows.append(row)
        print(f"{name}: exit {row.code}, {row.seconds:.1f} s, {row.peak_mb:.0f} MB: {row.said}", flush=True)

    def project(name: str, url: str = "http://127.0.0.1:9/") -> Path:
        root = work / name
        root.mkdir(parents=True)
        (root / "matrix.yaml").write_text(MATRIX.format(url=url))
        return root

    # 1. a pass signed for another wheel
    root = project("parity")
    b = wheel_set(root / "wheels")
    other = "flash_attn-2.8.3+cu130torch2.11cxx11abiTRUE.hd64128-cp312-cp312-linux_x86_64.whl"
    (root / "parity.json").write_text(
        json.dumps(
            {
                "device": "NVIDIA H100",
                "torch": "2.11.0+cu130",
                "wheel": other,
                "profile": "hd64128",
                "python": "cp312",
                "passed": 12,
                "failed": 0,
                "skipped": 0,
                "cases": [],
            }
        )
    )
    man = f"wheels/{b.filename}.manifest.json"
    add(
        "parity report made for another wheel",
        run(["parity", "record", man, "--report", "parity.json"], root, work / "parity.log"),
    )
    for name, text in (
        ("not JSON", "{nope"),
        ('{"failed": "abc"}', '{"failed": "abc"}'),
        ("[1, 2]", "[1, 2]"),
    ):
        (root / "bad.json").write_text(text)
        add(
            f"parity report {name}",
            run(["parity", "record", man, "--report", "bad.json"], root, work / "bad.log"),
        )
    # 2. METADATA zip bomb with a manifest matching its bytes
    root = project("bomb")
    wheel = zip_bomb(root / "wheels", 1 << 30)
    add(
        "zip-bomb METADATA (1 GiB inflated, unsigned)",
        run(["publish", "--to", "./index", str(wheel.relative_to(root))], root, work / "bomb1.log"),
    )
    add(
        "zip-bomb METADATA, --allow-unsigned",
        run(
            ["publish", "--to", "./index", "--allow-unsigned", str(wheel.relative_to(root))],
            root,
            work / "bomb2.log",
        ),
    )
    # 3. passwords and tokens
    py = _venv_with_wheel(work / "env", wheel_set(work / "doctor-wheel"))
    root = project("secrets")
    port = _closed_port()
    url = f"http://forge:{PASSWORD}@127.0.0.1:{port}/"
    add(
        "which --index-url with a password",
        run(["which", "--index-url", url, "--timeout", "5"], root, work / "which-pw.log"),
    )
    add(
        "$ATTNFORGE_INDEX_URL with a password",
        run(["which", "--timeout", "5"], root, work / "which-env.log", env={"ATTNFORGE_INDEX_URL": url}),
    )
    add(
        "doctor --verify --index-url with a password",
        run(
            ["doctor", "--verify", "--python", str(py), "--index-url", url, "--timeout", "5"],
            root,
            work / "doctor-pw.log",
        ),
    )
    add(
        "which --index-url ...?token=",
        run(
            ["which", "--index-url", f"http://127.0.0.1:{port}/?token={TOKEN}"],
            root,
            work / "which-token.log",
        ),
    )
    # 4. the index's own metadata
    root = project("marker")
    wheel_set(root / "wheels")
    run(["publish", "--to", "./index", "--allow-unsigned"], root, work / "marker0.log")
    marker = root / "index" / "attnforge-index.json"
    data = json.loads(marker.read_text())
    for rec in data["files"].values():
        rec["variant"] = "../../X"
    marker.write_text(json.dumps(data))
    add(
        "attnforge-index.json variant ../../X",
        run(["publish", "--to", "./index", "--allow-unsigned"], root, work / "marker1.log"),
    )
    assert not (work / "X").exists() and not (root / "X").exists()
    # 5. waits
    root = project("fifo")
    (root / "wheels").mkdir()
    os.mkfifo(root / "wheels" / "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl")
    add(
        "a FIFO named *.whl in the publish folder",
        run(["publish", "--to", "./index"], root, work / "fifo.log", timeout=30),
    )
    with http_server(UploadDrip) as drip_url:
        root = project("upload", drip_url)
        wheel_set(root / "wheels")
        add(
            "upload to a server dripping 1 byte/s (--timeout 10)",
            run(
                ["publish", "--to", "drip", "--allow-unsigned", "--timeout", "10"], root, work / "upload.log"
            ),
        )
    with _silent_server() as silent_url:
        root = project("silent", silent_url)
        wheel_set(root / "wheels")
        add(
            "upload to a server that never answers (--timeout 10)",
            run(
                ["publish", "--to", "drip", "--allow-unsigned", "--timeout", "10"], root, work / "silent.log"
            ),
        )
    with http_server(Drip) as drip_url:
        root = project("doctor")
        add(
            "doctor --verify against a dripping index (--timeout 10)",
            run(
                ["doctor", "--verify", "--python", str(py), "--index-url", drip_url, "--timeout", "10"],
                root,
                work / "doctor-drip.log",
            ),
        )
    root = project("fallback")
    wheel_set(root / "wheels")
    with _default_pypiserver(root) as pypi_url:
        (root / "matrix.yaml").write_text(MATRIX.format(url=pypi_url))
        add(
            "publish to a default pypiserver (no --disable-fallback)",
            run(["publish", "--to", "drip", "--allow-unsigned"], root, work / "fallback.log"),
        )
    add("serve: 500 idle connections, GET /a%00b, a reset mid-download", _serve_trial(work))
    # 6. numbers
    root = project("numbers")
    for name, text in (
        ("version: <4,301 digits>", "version: " + "1" * 4301 + "\n"),
        (
            "max_jobs: <4,301 digits>",
            MATRIX.format(url="http://x/") + "build: {resources: {max_jobs: " + "9" * 4301 + "}}\n",
        ),
        (
            "max_jobs: 1000000000",
            MATRIX.format(url="http://x/") + "build: {resources: {max_jobs: 1000000000}}\n",
        ),
    ):
        (root / "matrix.yaml").write_text(text)
        add(f"matrix.yaml {name}", run(["plan"], root, work / "numbers.log"))
    root = project("yank")
    wheel_set(root / "wheels")
    run(["publish", "--to", "./index", "--allow-unsigned"], root, work / "yank0.log")
    (root / "matrix.yaml").write_text(
        MATRIX.format(url="http://x/").replace(
            "destinations:\n", "destinations:\n  local: {kind: static, path: index}\n"
        )
    )
    name = next((root / "wheels").glob("*.whl")).name
    add("yank --reason <100 KB>", run(["yank", name, "--reason", "x" * 102_400], root, work / "yank.log"))
    return rows


@contextlib.contextmanager
def _default_pypiserver(root: Path) -> Iterator[str]:
    """pypiserver as `pypi-server run` starts it by default: a project it lacks redirects to pypi.org."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "packages").mkdir()
    exe = Path(sys.executable).parent / "pypi-server"
    cmd = [str(exe), "run", "-i", "127.0.0.1", "-p", str(port), "-a", ".", "-P", ".", "--server", "wsgiref"]
    with (root / "pypiserver.log").open("w") as log:
        proc = subprocess.Popen([*cmd, str(root / "packages")], stdout=log, stderr=log)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait(10)


def _serve_trial(work: Path) -> Row:
    """`attnforge serve --idle-timeout 2` on a published index: 500 silent connections, a NUL path, a client
    that resets mid-download; then SIGTERM. Measured as `run` measures, what it said from its log."""
    root = work / "serve"
    root.mkdir()
    b = make_bundle(root / "in", "cu130torch2.14cxx11abiTRUE", body=os.urandom(8 << 20))
    from attnforge.publish.index import StaticIndex

    StaticIndex(root / "index").publish([b])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    args = ["serve", "--port", "0", "--idle-timeout", "2", "index"]
    log = work / "serve.log"
    start = time.monotonic()
    with log.open("w") as err:
        proc = launch(
            [sys.executable, "-m", "attnforge.cli", *args],
            log.with_suffix(".rss"),
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert proc.stdout is not None
        port = int(proc.stdout.readline().rsplit(":", 1)[-1].strip("/\n"))
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(500)]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /a%00b HTTP/1.0\r\n\r\n")
            nul = s.recv(100).split(b"\r\n")[0].decode()
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(f"GET /all/simple/flash-attn/{b.filename} HTTP/1.0\r\n\r\n".encode())
        conn.recv(1000)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        conn.close()
        time.sleep(4)
        closed = 0
        for c in idle:
            c.settimeout(1)
            with contextlib.suppress(OSError):
                closed += c.recv(1) == b""
            c.close()
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    said = (
        f"`{nul}` for /a%00b; {closed} of 500 idle connections closed by the server after 2 s; "
        f"tracebacks in its log: {text.count('Traceback')}; the reset: "
        + next(
            (line.split(" ", 1)[1] for line in text.splitlines() if "connection ended" in line), "(no line)"
        )
    )
    peak = peak_mb(log.with_suffix(".rss"))
    return Row("", "attnforge " + " ".join(args), proc.returncode, time.monotonic() - start, peak, said)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _silent_server() -> Iterator[str]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def loop() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(srv.accept()[0])

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/"
    finally:
        stop.set()
        for c in held:
            c.close()
        srv.close()


def _venv_with_wheel(where: Path, bundle: Any) -> Path:
    venv.create(where, with_pip=False, symlinks=True)
    py = where / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(bundle.wheel)],
        check=True,
    )
    return py


def table(rows: list[Row]) -> str:
    out = ["| trial | command | exit | time | peak memory | what it said |", "|---|---|---|---|---|---|"]
    for r in rows:
        said = r.said.replace("|", "\\|")
        if len(said) > 260:
            said = said[:257] + "..."
        cmd = r.command.replace("|", "\\|")
        out.append(f"| {r.trial} | `{cmd}` | {r.code} | {r.seconds:.1f} s | {r.peak_mb:.0f} MB | {said} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", type=Path, help="keep the trials' files here (default: a temporary folder)")
    ap.add_argument("--report", type=Path, default=REPO / "reports" / "reliability.md")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="attnforge-trials-"))
    rows = trials(work)
    for r in rows:  # this machine's folders are not part of what a trial shows
        for path, name in ((str(work), "$WORK"), (str(Path.home()), "~")):
            r.said, r.command = r.said.replace(path, name), r.command.replace(path, name)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    body = (
        f"{BEGIN}\n_Generated by `scripts/hostile_trials.py` on {stamp} ({os.cpu_count()} cores, Python "
        f"{platform.python_version()}); peak memory is the process's own maximum resident set (wait4)._\n\n"
        f"{table(rows)}\n{END}"
    )
    text = args.report.read_text()
    text = text[: text.index(BEGIN)] + body + text[text.index(END) + len(END) :]
    args.report.write_text(text)
    leaked = [
        str(p)
        for p in [*work.rglob("*"), args.report]
        if p.is_file()
        and not p.is_fifo()
        and p.suffix != ".whl"
        and (PASSWORD.encode() in p.read_bytes() or TOKEN.encode() in p.read_bytes())
    ]
    leaked = [p for p in leaked if not p.endswith(("pip.conf", "matrix.yaml"))]  # the trials' own inputs
    print(f"{len(rows)} trials; files holding a trial secret: {leaked or 'none'}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if leaked else 0


if __name__ == "__main__":
    raise SystemExit(main())
