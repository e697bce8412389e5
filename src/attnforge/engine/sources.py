"""Kernel sources on the host: download once into the cache (PyPI sdists, URLs), take a local archive, or pack
a pinned git commit (`gitsource`), verify it against the pin, and hand the builder a `Source`."""

from __future__ import annotations

import re
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from attnforge.builder.files import sha256_file
from attnforge.builder.spec import Source
from attnforge.core.errors import BuildError, ConfigurationError, EnvironmentProblem
from attnforge.engine.gitsource import git_archive
from attnforge.matrix.schema import KernelSpec
from attnforge.matrix.source_lock import sdist_url, source_path


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
    """A verified source archive for the kernel. `expected_sha256` is the pin: an archive's sha256, or for a git
    source its commit (the archive packed from it is recorded by its own sha256)."""
    src = spec.source
    if src.kind == "git":
        assert src.url is not None and src.ref is not None
        if expected_sha256 is None or not re.fullmatch(r"[0-9a-f]{40}", expected_sha256):
            raise ConfigurationError(
                f"{kernel} {spec.version}: git ref {src.ref!r} is not pinned to a commit: run `attnforge lock` "
                "or give the full commit as ref"
            )
        archive = git_archive(kernel, src.url, expected_sha256, cache)
        return Source(path=str(archive), sha256=sha256_file(archive), url=None, subdir=src.subdir or "")
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
