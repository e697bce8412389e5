"""Members of a wheel on a package index, read through HTTP range requests (remotezip): the zip's central
directory and the members asked for, not the whole file (three headers of an 800 MB torch wheel take a few
requests).

`torch_headers(version)` keeps the few torch headers attnforge's own headers compile against (the Philox
state's, `PHILOX_HEADERS`) in a per-user cache, so a check against every torch release of the matrix pays
the index once (docs/build-internals.md, "The kernel units without torch").
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable
from pathlib import Path

import requests
from remotezip import RemoteIOError, RemoteZip

from attnforge.builder.files import atomic_write_bytes, atomic_write_text
from attnforge.core.errors import EnvironmentProblem
from attnforge.matrix.source_lock import PYPI_SIMPLE, simple_files

# What attnforge_philox_torch.h includes from torch, and torch's own unpack (to compare conversions with).
PHILOX_HEADERS = (
    "ATen/cuda/PhiloxCudaState.h",
    "ATen/cuda/detail/PhiloxCudaStateRaw.cuh",
    "ATen/cuda/detail/UnpackRaw.cuh",
)
_TIMEOUT = 60


def _ca_bundle() -> str | bool:
    """The CA bundle pip is told to use (an intercepting proxy's), else the system's trust store."""
    for key in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(key) and Path(os.environ[key]).is_file():
            return os.environ[key]
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    return str(system) if system.is_file() else True


def _ssl_context() -> ssl.SSLContext:
    bundle = _ca_bundle()
    return ssl.create_default_context(cafile=bundle if isinstance(bundle, str) else None)


def read_members(url: str, names: Iterable[str]) -> dict[str, bytes]:
    """The named members of the zip at `url`, read through HTTP range requests (remotezip): the central
    directory and those members, not the whole file. A missing one is an EnvironmentProblem naming it."""
    try:
        with RemoteZip(url, verify=_ca_bundle(), timeout=_TIMEOUT) as zf:
            have = set(zf.namelist())
            missing = [n for n in names if n not in have]
            if missing:
                raise EnvironmentProblem(f"{url}: no {', '.join(missing)} in the archive")
            return {n: zf.read(n) for n in names}
    except (RemoteIOError, requests.RequestException, OSError, zipfile.BadZipFile) as exc:
        raise EnvironmentProblem(f"cannot read {url}: {exc}") from None


def wheel_url(
    project: str, version: str, platform: str = "manylinux", index: str = PYPI_SIMPLE
) -> tuple[str, str]:
    """(file name, URL) of a Linux x86_64 wheel of project==version on a simple index (PEP 691 or 503)."""
    page_url = f"{index.rstrip('/')}/{project}/"
    req = urllib.request.Request(
        page_url, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}
    )
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT, context=_ssl_context()) as resp:
            body, ctype = resp.read(), resp.headers.get("Content-Type", "")
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise EnvironmentProblem(f"cannot reach the package index {index}: {exc}") from None
    prefix = f"{project.replace('-', '_')}-{version}-"
    for filename, url, _sha in simple_files(body, ctype, page_url):
        if filename.startswith(prefix) and platform in filename and filename.endswith("_x86_64.whl"):
            return filename, url
    raise EnvironmentProblem(f"{page_url}: no {platform} x86_64 wheel of {project} {version}")


def headers_cache() -> Path:
    """$ATTNFORGE_TORCH_HEADERS, else <user cache>/attnforge/torch-headers."""
    env = os.environ.get("ATTNFORGE_TORCH_HEADERS")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnforge" / "torch-headers"


def torch_headers(version: str, names: Iterable[str] = PHILOX_HEADERS, cache: Path | None = None) -> Path:
    """An include folder holding torch==version's `names` (paths below torch/include), read from its PyPI wheel
    once and kept under `cache` (default `headers_cache()`) with `source.json` naming the wheel."""
    wanted = list(names)
    top = (cache or headers_cache()) / version
    include = top / "include"
    if all((include / n).is_file() for n in wanted):
        return include
    filename, url = wheel_url("torch", version)
    members = read_members(url, [f"torch/include/{n}" for n in wanted])
    for name in wanted:
        atomic_write_bytes(include / name, members[f"torch/include/{name}"])
    atomic_write_text(
        top / "source.json", json.dumps({"wheel": filename, "url": url, "headers": wanted}, indent=2)
    )
    return include
