"""Kernel sources: download (once, into the cache) and verify against the pinned sha256."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import BuildError, ConfigurationError, EnvironmentProblem
from ..locking import sdist_url
from ..schema import KernelSpec


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(url: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, suffix=".part") as tmp:
        try:
            with urllib.request.urlopen(url, timeout=120) as resp:
                shutil.copyfileobj(resp, tmp)
        except (urllib.error.URLError, TimeoutError) as exc:
            Path(tmp.name).unlink(missing_ok=True)
            raise EnvironmentProblem(f"cannot download {url}: {exc}") from None
    Path(tmp.name).replace(dest)


def fetch_sdist(kernel: str, spec: KernelSpec, expected_sha256: str | None, cache: Path, base: Path) -> Path:
    """Return a verified sdist for the kernel (pypi-sdist or path sources). git sources are not built yet."""
    src = spec.source
    if src.kind == "git":
        raise ConfigurationError(
            f"{kernel}: git sources are declared but not buildable yet; use pypi-sdist or path"
        )
    if src.kind == "path":
        assert src.path is not None
        path = Path(src.path) if Path(src.path).is_absolute() else base / src.path
        if not path.is_file():
            raise ConfigurationError(f"{kernel}: source path {path} is not an sdist file")
    else:
        name = f"{kernel.replace('-', '_')}-{spec.version}.tar.gz"
        path = cache / "sources" / name
        if not path.exists():
            url = src.url or sdist_url(kernel, spec.version)[0]
            _download(url, path)
    if expected_sha256 is None:
        raise ConfigurationError(
            f"{kernel} {spec.version}: no sha256 pinned: run `attnforge lock` or set kernels.{kernel}.source.sha256"
        )
    actual = sha256_of(path)
    if actual != expected_sha256:
        if src.kind == "pypi-sdist":
            path.unlink(missing_ok=True)
        raise BuildError(
            f"{kernel} {spec.version}: sdist sha256 {actual[:16]}… does not match the pin {expected_sha256[:16]}… "
            f"({path.name}): the upstream file changed or the download is corrupt; nothing was compiled"
        )
    return path
