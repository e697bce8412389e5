"""Source pins: `attnforge lock` records each kernel source's sha256 in attnforge.lock: a PyPI sdist's URL and
digest, a `path` or `url` archive's digest, a `git` ref's commit."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from attnforge.builder.files import atomic_write_text, sha256_file
from attnforge.core.errors import ConfigurationError, EnvironmentProblem
from attnforge.matrix.compat import CompatData
from attnforge.matrix.schema import KernelSpec, Matrix, SourceSpec

LOCK_FILE = "attnforge.lock"
PYPI_SIMPLE = os.environ.get("ATTNFORGE_PYPI_SIMPLE", "https://pypi.org/simple")


def read_lock(path: str | Path) -> dict[str, Any]:
    """Read a lock file (a missing file is an empty lock)."""
    p = Path(path)
    if not p.exists():
        return {}
    try:
        lock: dict[str, Any] = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{p}:{exc.lineno}:{exc.colno}: invalid lock file: {exc.msg}") from None
    return lock


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def source_path(kernel: str, source: SourceSpec, base: Path) -> Path:
    """A `path` source's archive: `${VAR}`/`${VAR:-default}` expanded, relative to `base` (matrix.yaml's
    folder). ConfigurationError naming the kernel, the path as written and as resolved when it is missing."""
    assert source.path is not None
    written = source.path

    def expand(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value:
            return value
        if m.group(2) is None:
            raise ConfigurationError(
                f"{kernel}: source path {written!r} uses ${{{m.group(1)}}}, which is not set (or write "
                f"${{{m.group(1)}:-default}})"
            )
        return m.group(2)

    text = _VAR.sub(expand, written)
    path = Path(text) if Path(text).is_absolute() else base / text
    if not path.is_file():
        names = ", ".join(sorted({m.group(1) for m in _VAR.finditer(written)}))
        hint = f" (set {names} to the folder that holds it)" if names else ""
        raise ConfigurationError(
            f"{kernel}: source archive {path} does not exist (kernels.{kernel}.source.path {written!r}, relative "
            f"to {base}){hint}"
        )
    return path


def source_sha256(kernel: str, spec: KernelSpec, data: CompatData, lock: dict[str, Any]) -> str | None:
    """The source pin: matrix.yaml's sha256 first, then attnforge.lock's, then the compat table's PyPI digest;
    for a git source its commit (a full-commit ref, else the lock's)."""
    if spec.source.kind == "git":
        ref = spec.source.ref or ""
        commit = lock.get(kernel, {}).get(spec.version, {}).get("commit")
        return ref if re.fullmatch(r"[0-9a-f]{40}", ref) else (str(commit) if commit else None)
    if spec.source.sha256:
        return spec.source.sha256
    locked = lock.get(kernel, {}).get(spec.version, {}).get("sha256")
    if locked:
        return str(locked)
    if spec.source.kind == "pypi-sdist":
        row = data.kernel_release(kernel, spec.version)
        return row.sdist_sha256 if row else None
    return None


class _Anchors(HTMLParser):
    """The ``<a href>`` targets and texts of a PEP 503 simple page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((self._href, data.strip()))
            self._href = None


def simple_files(body: bytes, content_type: str, page_url: str) -> list[tuple[str, str, str | None]]:
    """(filename, absolute url, sha256 or None) of a simple-index page, PEP 691 JSON or PEP 503 HTML."""
    if "json" in content_type:
        page = json.loads(body)
        return [
            (f["filename"], urllib.parse.urljoin(page_url, f["url"]), (f.get("hashes") or {}).get("sha256"))
            for f in page.get("files", [])
        ]
    parser = _Anchors()
    parser.feed(body.decode("utf-8", errors="replace"))
    out = []
    for href, text in parser.links:
        url, _, frag = href.partition("#")
        sha = frag.split("=", 1)[1] if frag.startswith("sha256=") else None
        name = text or urllib.parse.unquote(url.rstrip("/").rsplit("/", 1)[-1])
        out.append((name, urllib.parse.urljoin(page_url, url), sha))
    return out


def sdist_url(kernel: str, version: str, index: str = PYPI_SIMPLE) -> tuple[str, str]:
    """Ask the simple API (PEP 691 JSON, else PEP 503 HTML: mirrors differ) for kernel==version's sdist:
    (url, sha256)."""
    name = kernel.lower().replace("_", "-")
    page_url = f"{index.rstrip('/')}/{name}/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    req = urllib.request.Request(page_url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            body, ctype = resp.read(), resp.headers.get("Content-Type", "")
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise EnvironmentProblem(f"cannot reach the package index {index}: {exc}") from None
    try:
        files = simple_files(body, ctype, page_url)
    except (ValueError, KeyError, TypeError) as exc:
        raise EnvironmentProblem(
            f"{page_url}: not a simple-index page ({ctype or 'no content type'}): {exc}"
        ) from None
    wanted = f"{name.replace('-', '_')}-{version}.tar.gz"
    for filename, url, sha in files:
        if filename.lower() == wanted:
            if not sha:
                raise EnvironmentProblem(f"{page_url}: {wanted} is listed without a sha256")
            return url, sha
    raise ConfigurationError(f"{kernel} {version}: no sdist named {wanted} on {index}")


def _url_sha256(url: str) -> str:
    """sha256 of what a URL serves (streamed, not kept)."""
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                h.update(chunk)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise EnvironmentProblem(f"cannot download {url}: {exc}") from None
    return h.hexdigest()


def git_commit(url: str, ref: str) -> str:
    """The commit a git ref names (`git ls-remote`; a 40-hex ref is its own commit)."""
    if re.fullmatch(r"[0-9a-f]{40}", ref):
        return ref
    try:
        proc = subprocess.run(
            ["git", "ls-remote", url, ref, f"{ref}^{{}}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentProblem(f"git ls-remote {url}: {exc}") from None
    if proc.returncode != 0:
        raise EnvironmentProblem(f"git ls-remote {url} {ref}: {proc.stderr.strip() or proc.returncode}")
    rows = [ln.split("\t") for ln in proc.stdout.splitlines() if "\t" in ln]
    peeled = [sha for sha, name in rows if name.endswith("^{}")]  # an annotated tag's commit
    commits = peeled or [sha for sha, _ in rows]
    if not commits:
        raise ConfigurationError(f"{url}: no ref {ref!r} (a tag, branch or full commit)")
    return commits[0]


def _pin(kernel: str, spec: KernelSpec, base: Path) -> dict[str, Any]:
    """One kernel's lock entry."""
    src = spec.source
    if src.kind == "pypi-sdist":
        url, sha = sdist_url(kernel, spec.version)
        entry: dict[str, Any] = {"url": url, "sha256": sha}
    elif src.kind == "path":
        entry = {"path": src.path, "sha256": sha256_file(source_path(kernel, src, base))}
    elif src.kind == "url":
        assert src.url is not None
        entry = {"url": src.url, "sha256": _url_sha256(src.url)}
    else:
        assert src.url is not None and src.ref is not None
        return {"url": src.url, "ref": src.ref, "commit": git_commit(src.url, src.ref)}
    if src.sha256 and src.sha256 != entry["sha256"]:
        raise ConfigurationError(
            f"{kernel} {spec.version}: matrix.yaml pins sha256 {src.sha256[:12]}… but the {src.kind} source is "
            f"{entry['sha256'][:12]}…: the upstream file changed"
        )
    return entry


def write_lock(matrix: Matrix, path: str | Path) -> dict[str, Any]:
    """Pin every kernel's source (see the module docstring) and write the lock atomically."""
    lock: dict[str, Any] = {}
    base = Path(path).resolve().parent
    for kernel, spec in matrix.kernels.items():
        lock.setdefault(kernel, {})[spec.version] = _pin(kernel, spec, base)
    atomic_write_text(Path(path), json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return lock
