"""Source pins: `attnforge lock` records each kernel sdist's URL and sha256 in attnforge.lock."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from ..builder.files import atomic_write_text
from ..errors import ConfigurationError, EnvironmentProblem
from .compat import CompatData
from .schema import KernelSpec, Matrix

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


def source_sha256(kernel: str, spec: KernelSpec, data: CompatData, lock: dict[str, Any]) -> str | None:
    """The pinned sha256: matrix.yaml first, then attnforge.lock, then the compat table's PyPI digest."""
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
        return [(f["filename"], urllib.parse.urljoin(page_url, f["url"]), (f.get("hashes") or {}).get("sha256"))
                for f in page.get("files", [])]  # fmt: skip
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


def write_lock(matrix: Matrix, path: str | Path) -> dict[str, Any]:
    """Resolve every pypi-sdist kernel and write the lock atomically."""
    lock: dict[str, Any] = {}
    for kernel, spec in matrix.kernels.items():
        if spec.source.kind != "pypi-sdist":
            continue
        url, sha = sdist_url(kernel, spec.version)
        if spec.source.sha256 and spec.source.sha256 != sha:
            raise ConfigurationError(
                f"{kernel} {spec.version}: matrix.yaml pins sha256 {spec.source.sha256[:12]}… but the index "
                f"serves {sha[:12]}…: the upstream sdist changed"
            )
        lock.setdefault(kernel, {})[spec.version] = {"url": url, "sha256": sha}
    atomic_write_text(Path(path), json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return lock
