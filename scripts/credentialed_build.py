"""A real default-target build whose only package index is private, then a search for its password everywhere.

The index is a real pypiserver on 127.0.0.1 that answers nothing without the password (htpasswd,
`-a download,list,update`). It holds what the builds' pip installs (torch 2.14.1 and everything it pulls, the
build requirements) and what the cuda-builder image's CUDA-from-PyPI step installs (nvcc, cudart, cccl, crt,
nvvm 13.0): the exact files a dry-run resolution picks, hard-linked from local mirrors or downloaded. The
project's matrix names the index the documented way: `build.pip.index_url` without credentials,
`build.pip.netrc` a netrc file (mode 600), `inherit_host_config: false`. The builder image is built fresh
(its tag removed first) so its CUDA step goes through the same index.

While `attnforge build -t default --backend docker` runs, every process's command line and environment is
read from /proc every 50 ms and `ps -eww -o pid,args` / `ps eww -e` are sampled every 2 s. Afterwards the
password is searched for in: every file under the project, the build cache and the output folder (logs,
spec.json, result.json, the manifest, the records, the venv), every member of the wheel, `docker history
--no-trunc` and `docker inspect` of the builder image, a `docker save` of it (streamed) and the samples.
Positive controls show the search would find it: the netrc holds it, and pypiserver logged the downloads.

    PYTHONPATH=src python scripts/credentialed_build.py --work /tmp/credbuild \\
        --mirror /opt/pypi/files --mirror /opt/pypi-more/files --out reports/security/credentialed_build.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
USER = "forge"
# the CUDA step's own output line (BuildKit: "#6 0.412 index credentials: ..."), not the RUN text that holds it
SAID = re.compile(r"^#\d+ \d+\.\d+ index credentials: given as a secret \(netrc\)", re.MULTILINE)
CUDA_PACKAGES = [
    "nvidia-cuda-nvcc",
    "nvidia-cuda-runtime",
    "nvidia-cuda-cccl",
    "nvidia-cuda-crt",
    "nvidia-nvvm",
]
BUILD_REQUIREMENTS = ["torch==2.14.1", "setuptools>=77", "wheel", "packaging", "ninja"]  # builder spec.py


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def resolve(requirements: list[str], no_deps: bool, work: Path) -> list[dict[str, Any]]:
    """The files pip would install for `requirements` (cp311, x86-64) through this machine's pip config."""
    report = work / f"resolve-{len(list(work.glob('resolve-*.json')))}.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:"]
    cmd += ["--quiet", "--report", str(report), *(["--no-deps"] if no_deps else []), *requirements]
    subprocess.run(cmd, check=True)
    return list(json.loads(report.read_text())["install"])


def fill(packages: Path, items: list[dict[str, Any]], mirrors: list[Path]) -> dict[str, int]:
    """Each resolved file into `packages`: a hard link from a mirror folder, else downloaded; sha256 checked."""
    counts = {"linked": 0, "downloaded": 0}
    for item in items:
        info = item["download_info"]
        url: str = info["url"]
        name = url.rsplit("/", 1)[-1].split("#")[0]
        want = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        dest = packages / name
        if dest.exists():
            continue
        local = next((m / name for m in mirrors if (m / name).is_file()), None)
        if local is not None:
            try:
                os.link(local, dest)
            except OSError:
                shutil.copy2(local, dest)
            counts["linked"] += 1
        else:
            with urllib.request.urlopen(url, timeout=300) as resp, dest.open("wb") as fh:
                shutil.copyfileobj(resp, fh)
            counts["downloaded"] += 1
        if want:
            h = hashlib.sha256()
            with dest.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            if h.hexdigest() != want:
                raise SystemExit(f"{name}: sha256 differs from the resolver's")
    return counts


def start_pypiserver(root: Path, password: str) -> tuple[subprocess.Popen[bytes], str]:
    from passlib.apache import HtpasswdFile

    ht = HtpasswdFile(str(root / "htpasswd"), new=True, default_scheme="apr_md5_crypt")
    ht.set_password(USER, password)
    ht.save()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "pypi-server"
    cmd = [str(exe), "run", "-i", "127.0.0.1", "-p", str(port), "-P", str(root / "htpasswd")]
    cmd += [
        "-a",
        "download,list,update",
        "--disable-fallback",
        "--hash-algo",
        "sha256",
        "--server",
        "wsgiref",
    ]
    cmd += ["-vv", "--log-file", str(root / "pypiserver.log"), str(root / "packages")]
    with (root / "pypiserver.out").open("wb") as out:  # wsgiref's access lines (status of every request)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/", timeout=2)
            break
        except urllib.error.HTTPError:
            break  # it answers (401 where everything needs the password)
        except OSError:
            time.sleep(0.2)
    return proc, url


class Watch:
    """/proc cmdline+environ every 50 ms and `ps` every 2 s, searched for the needle."""

    def __init__(self, needle: str, ps_log: Path) -> None:
        self.needle = needle.encode()
        self.ps_log = ps_log
        self.proc_samples = 0
        self.ps_samples = 0
        self.hits: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._proc, daemon=True),
            threading.Thread(target=self._ps, daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _proc(self) -> None:
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                for part in ("cmdline", "environ"):
                    try:
                        data = (proc / part).read_bytes()
                    except OSError:
                        continue
                    if self.needle in data:
                        self.hits.append(f"/proc/{proc.name}/{part}")
            self.proc_samples += 1
            self._stop.wait(0.05)

    def _ps(self) -> None:
        with self.ps_log.open("ab") as fh:
            while not self._stop.is_set():
                for cmd in (["ps", "-eww", "-o", "pid,args"], ["ps", "eww", "-e"]):
                    out = subprocess.run(cmd, capture_output=True, check=False).stdout
                    fh.write(out)
                    if self.needle in out:
                        self.hits.append(" ".join(cmd))
                self.ps_samples += 1
                self._stop.wait(2.0)


def files_with(needle: bytes, *roots: Path, skip: tuple[Path, ...] = ()) -> tuple[int, int, list[str]]:
    """(files searched, bytes searched, files holding `needle`) under `roots`."""
    n = size = 0
    hits: list[str] = []
    for root in roots:
        for path in root.rglob("*"):
            if any(path == s or s in path.parents for s in skip) or path.is_symlink() or not path.is_file():
                continue
            n += 1
            size += path.stat().st_size
            if stream_has(path.open("rb"), needle):
                hits.append(str(path))
    return n, size, hits


def stream_has(fh: Any, needle: bytes) -> bool:
    tail = b""
    with fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False


def image_checks(docker: str, tag: str, needle: bytes, work: Path) -> dict[str, Any]:
    """`docker history --no-trunc`, `docker inspect` and a streamed `docker save` of `tag`, searched."""
    history = subprocess.run([docker, "history", "--no-trunc", tag], capture_output=True).stdout
    inspect = subprocess.run([docker, "inspect", tag], capture_output=True).stdout
    (work / f"docker-history-{tag.replace('/', '_').replace(':', '_')}.txt").write_bytes(history)
    save = subprocess.Popen([docker, "save", tag], stdout=subprocess.PIPE)
    assert save.stdout is not None
    saved, tail, hit = 0, b"", False
    for chunk in iter(lambda: save.stdout.read(1 << 22), b""):  # type: ignore[union-attr]
        saved += len(chunk)
        hit = hit or needle in tail + chunk
        tail = chunk[-len(needle) :]
    save.wait()
    return {
        "docker history --no-trunc": {"bytes": len(history), "hits": int(needle in history)},
        "docker inspect": {"bytes": len(inspect), "hits": int(needle in inspect)},
        "docker save (streamed)": {"bytes": saved, "exit": save.returncode, "hits": int(hit)},
    }


def served_count(work: Path, pattern: str) -> int:
    """How many answered requests pypiserver logged for files matching `pattern`."""
    text = "".join(
        (work / "pypi" / name).read_text(errors="replace")
        for name in ("pypiserver.log", "pypiserver.out")
        if (work / "pypi" / name).exists()
    )
    return len(re.findall(pattern, text))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument(
        "--mirror", type=Path, action="append", default=[], help="folders of wheels to hard-link from"
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--docker", default="/usr/bin/docker")
    ap.add_argument(
        "--skip-build", action="store_true", help="only the builder image (--no-cache) against the index"
    )
    args = ap.parse_args()
    work: Path = args.work.resolve()
    if work.exists():
        shutil.rmtree(work)
    (work / "pypi" / "packages").mkdir(parents=True)
    (work / "proj").mkdir()
    password = "SECRET-" + secrets.token_hex(16)
    needle = password.encode()
    started = time.time()
    old: dict[str, Any] = json.loads(args.out.read_text()) if args.skip_build and args.out.is_file() else {}
    result: dict[str, Any] = {
        **old,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}, Docker backend (Debian's docker 20.10, BuildKit)",
        "password_form": "SECRET-<32 random hex digits>, new for every run",
    }
    result.setdefault("commands", [])
    result["commands"].append("PYTHONPATH=src python " + " ".join(shlex.quote(a) for a in sys.argv))

    say("resolving what the builds and the builder image install")
    torch_items = resolve(BUILD_REQUIREMENTS, False, work)
    cuda_items = resolve([f"{p}==13.0.*" for p in CUDA_PACKAGES], True, work)
    counts = fill(work / "pypi" / "packages", torch_items + cuda_items, [m.resolve() for m in args.mirror])
    files = sorted(p.name for p in (work / "pypi" / "packages").iterdir())
    result["private_index"] = {
        "files": len(files),
        **counts,
        "torch": [f for f in files if f.startswith("torch-")],
    }
    say(f"private index: {len(files)} files ({counts})")

    rc = 0
    server, url = start_pypiserver(work / "pypi", password)
    try:
        try:
            urllib.request.urlopen(url + "/simple/torch/", timeout=10)
            anonymous = 200
        except urllib.error.HTTPError as exc:
            anonymous = exc.code
        result["anonymous_read_status"] = anonymous
        if anonymous != 401:
            raise SystemExit(f"the index answered {anonymous} without the password: not a private index")
        netrc = work / "proj" / "netrc"
        fd = os.open(netrc, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"machine 127.0.0.1 login {USER} password {password}\n")

        data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
        data["build"] |= {"cache_dir": str(work / "cache"), "output_dir": str(work / "wheels")}
        data["build"]["pip"] = {"inherit_host_config": False, "index_url": f"{url}/simple/", "netrc": "netrc"}
        data.pop("signing", None)
        (work / "proj" / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        result["matrix_build_pip"] = {**data["build"]["pip"], "index_url": "http://127.0.0.1:<port>/simple/"}

        sys.path.insert(0, str(ROOT / "src"))
        from attnforge.engine.backends.docker import DockerBackend
        from attnforge.engine.progress import PlainProgressView
        from attnforge.matrix.project import Project

        project = Project(work / "proj" / "matrix.yaml")
        cell = project.plan("default").valid[0]
        backend = DockerBackend(project)
        base, cuda_from = backend.base_for(cell.toolkit)
        base = backend.pinned(base, PlainProgressView())
        tag = backend.builder_tag(cell.toolkit, base, cuda_from)
        if not args.skip_build:
            rc = build(args, work, password, tag, result)
        # the builder image once more, no layer from BuildKit's cache: its CUDA step runs against the index
        proof = "attnforge-proof/cuda-builder:private-index"
        log = work / "builder-image-no-cache.log"
        watch = Watch(password, work / "ps-samples-image.txt")
        watch.start()
        t0 = time.time()
        with PlainProgressView() as view:
            backend.build_builder(cell.toolkit, base, cuda_from, proof, view, no_cache=True, log=log)
        watch.stop()
        text = log.read_text(errors="replace")
        result["builder_image_no_cache"] = {
            "what": "DockerBackend.build_builder(..., no_cache=True): the docker backend's own builder-image build "
            "(pip.conf, netrc and CA bundle as BuildKit secrets), every step run again",
            "tag": proof,
            "wall_s": round(time.time() - t0, 1),
            "log holds the password": needle in log.read_bytes(),
            "log: the step printed 'index credentials: given as a secret (netrc)'": bool(SAID.search(text)),
            "log: steps CACHED": text.count(" CACHED"),
            "pypiserver: answered requests for nvidia-cuda-nvcc 13.0": served_count(
                work, r"nvidia_cuda_nvcc-13\.0"
            ),
            "process_watch": {
                "proc_samples": watch.proc_samples,
                "ps_samples": watch.ps_samples,
                "hits": watch.hits,
            },
            "checks": image_checks(args.docker, proof, needle, work),
        }
        subprocess.run([args.docker, "rmi", proof], capture_output=True, check=False)
    finally:
        server.terminate()
        server.wait()
    result["total_s"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    say(
        json.dumps({k: v for k, v in result.items() if k in ("checks", "positive_controls")}, indent=1)[:4000]
    )
    say(json.dumps(result["builder_image_no_cache"], indent=1))
    return 0 if rc == 0 else 1


def build(args: argparse.Namespace, work: Path, password: str, tag: str, result: dict[str, Any]) -> int:
    """`attnforge build -t default --backend docker` in the project, watched; then the search (module doc)."""
    needle = password.encode()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": "/dev/null", "ATTNFORGE_SIGNING_KEY": str(work / "keys" / "site.pem")}
    env["PYTHONPATH"] = str(ROOT / "src")
    attnforge = [sys.executable, "-m", "attnforge.cli"]
    subprocess.run([*attnforge, "keys", "generate", str(work / "keys" / "site.pem")], env=env, check=True)
    removed = subprocess.run([args.docker, "rmi", tag], capture_output=True, text=True).returncode == 0
    result["builder_image"] = {"tag": tag, "removed_before": removed}
    watch = Watch(password, work / "ps-samples.txt")
    watch.start()
    build_cmd = ["nice", "-n", "10", *attnforge, "build", "-t", "default", "--backend", "docker"]
    t0 = time.time()
    with (work / "build-output.log").open("wb") as out:
        rc = subprocess.run(
            build_cmd, cwd=work / "proj", env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    watch.stop()
    result["build"] = {
        "command": "attnforge build -t default --backend docker  (in the project folder, PIP_* unset)",
        "exit": rc,
        "wall_s": round(time.time() - t0, 1),
        "wheels": sorted(p.name for p in (work / "wheels").glob("*.whl")),
    }
    result["process_watch"] = {
        "proc_samples": watch.proc_samples,
        "ps_samples": watch.ps_samples,
        "hits": watch.hits,
    }
    say(f"build exit {rc} in {result['build']['wall_s']} s; process samples {watch.proc_samples}")
    checks: dict[str, Any] = {}
    n, size, hits = files_with(
        needle, work / "proj", work / "cache", work / "wheels", skip=(work / "proj" / "netrc",)
    )
    checks["files: project, build cache (venv included), wheels/ and logs"] = {
        "files": n,
        "bytes": size,
        "hits": hits,
    }
    for label, pattern in (
        ("spec.json", "**/spec.json"),
        ("result.json", "**/result.json"),
        ("manifest", "*.manifest.json"),
        ("build logs", "logs/*.log"),
    ):
        found = sorted({*(work / "cache").glob(pattern), *(work / "wheels").glob(pattern)})
        checks[label] = {
            "files": [str(p.relative_to(work)) for p in found],
            "hits": [str(p) for p in found if needle in p.read_bytes()],
        }
    members = 0
    wheel_hits: list[str] = []
    for wheel in (work / "wheels").glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                members += 1
                if needle in zf.read(name):
                    wheel_hits.append(f"{wheel.name}!{name}")
    checks["wheel members (unzipped)"] = {"members": members, "hits": wheel_hits}
    checks |= image_checks(args.docker, tag, needle, work)
    ps_text = (work / "ps-samples.txt").read_bytes()
    checks["ps samples"] = {"bytes": len(ps_text), "hits": int(needle in ps_text)}
    result["checks"] = checks
    builder_log = work / "wheels" / "logs" / "builder-cu130.log"
    blog = builder_log.read_text(errors="replace") if builder_log.exists() else ""
    cell_logs = "".join(
        p.read_text(errors="replace") for p in (work / "wheels" / "logs").glob("flash-attn-*.log")
    )
    result["positive_controls"] = {
        "netrc holds the password": needle in (work / "proj" / "netrc").read_bytes(),
        "pypiserver: answered requests for torch-2.14.1 (cp311)": served_count(work, r"torch-2\.14\.1-cp311"),
        "pypiserver: answered requests for nvidia-cuda-nvcc 13.0": served_count(
            work, r"nvidia_cuda_nvcc-13\.0"
        ),
        "builder image log: the step printed 'index credentials: given as a secret (netrc)'": bool(
            SAID.search(blog)
        ),
        "builder image log: steps CACHED": blog.count(" CACHED"),
        "cell log: pip looked in the private index": bool(
            re.search(r"Looking in indexes: http://127\.0\.0\.1:\d+/simple/", cell_logs)
        ),
    }
    return rc


if __name__ == "__main__":
    sys.exit(main())
