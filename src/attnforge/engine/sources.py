"""Kernel sources on the host: download once into the cache (PyPI sdists, URLs) or take a local archive,
verify it against the pinned sha256, and hand the builder a `Source`."""

from __future__ import annotations

import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from ..builder.files import sha256_file
from ..builder.spec import Source
from ..errors import BuildError, ConfigurationError, EnvironmentProblem
from ..matrix.lock import sdist_url, source_path
from ..matrix.schema import KernelSpec


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


def fetch_source(
    kernel: str, spec: KernelSpec, expected_sha256: str | None, cache: Path, base: Path
) -> Source:
    """A verified source archive for the kernel (pypi-sdist, url or path sources); git is refused here."""
    src = spec.source
    if src.kind == "git":
        raise ConfigurationError(
            f"{kernel}: git sources are not fetched at build time (no network in builders): make an archive "
            f"with `git archive` of {src.ref} and name it with source.kind 'path' (and its sha256)"
        )
    if src.kind == "path":
        path = source_path(kernel, src, base)
    else:
        name = Path(src.url).name if src.url else f"{kernel.replace('-', '_')}-{spec.version}.tar.gz"
        path = cache / "sources" / name
        if not path.exists():
            _download(src.url or sdist_url(kernel, spec.version)[0], path)
    if expected_sha256 is None:
        raise ConfigurationError(
            f"{kernel} {spec.version}: no sha256 pinned: run `attnforge lock` or set kernels.{kernel}.source.sha256"
        )
    actual = sha256_file(path)
    if actual != expected_sha256:
        if src.kind != "path":
            path.unlink(missing_ok=True)
        raise BuildError(
            f"{kernel} {spec.version}: source sha256 {actual[:16]}… does not match the pin {expected_sha256[:16]}… "
            f"({path.name}): the upstream file changed or the download is corrupt; nothing was compiled"
        )
    return Source(path=str(path), sha256=actual, subdir=src.subdir or "")
