"""Source pins: `attnforge lock` records each kernel sdist's URL and sha256 in attnforge.lock."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .compat import CompatData
from .errors import ConfigurationError, EnvironmentProblem
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


def sdist_url(kernel: str, version: str, index: str = PYPI_SIMPLE) -> tuple[str, str]:
    """Ask PyPI's JSON simple API (PEP 691) for the sdist of kernel==version: (url, sha256)."""
    name = kernel.lower().replace("_", "-")
    req = urllib.request.Request(
        f"{index.rstrip('/')}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            page = json.load(resp)
    except (urllib.error.URLError, TimeoutError) as exc:
        raise EnvironmentProblem(f"cannot reach the package index {index}: {exc}") from None
    wanted = f"{name.replace('-', '_')}-{version}.tar.gz"
    for f in page.get("files", []):
        if f["filename"].lower() == wanted:
            return f["url"], f["hashes"]["sha256"]
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
    p = Path(path)
    with tempfile.NamedTemporaryFile("w", dir=p.parent or ".", delete=False, suffix=".tmp") as tmp:
        json.dump(lock, tmp, indent=2, sort_keys=True)
        tmp.write("\n")
    os.replace(tmp.name, p)
    return lock
