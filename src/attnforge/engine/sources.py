"""Kernel sources on the host: download once into the cache (PyPI sdists, URLs), take a local archive, or pack
a pinned git commit (`gitsource`), verify it against the pin, and hand the builder a `Source`.

A `git` source may instead come from a folder of pinned snapshots, `$ATTNFORGE_SOURCES` (air-gapped sites, CI,
this project's tests): an archive there named `<anything>-<commit prefix, 7+ hex digits>.tar.gz` replaces the
fetch, checked against the source's `sha256` (the snapshot's own pin; the commit stays the cell's pin).
"""

from __future__ import annotations

import os
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


SOURCES_ENV = "ATTNFORGE_SOURCES"
_SNAPSHOT = re.compile(r"-([0-9a-f]{7,40})\.tar\.gz$")


def git_snapshot(kernel: str, commit: str, sha256: str | None) -> Path | None:
    """The snapshot of `commit` in `$ATTNFORGE_SOURCES` (None when the variable is unset or the folder has none).
    ConfigurationError for a snapshot without a pin; BuildError when no snapshot of the commit matches it."""
    folder = os.environ.get(SOURCES_ENV)
    if not folder:
        return None
    root = Path(folder)
    if not root.is_dir():
        raise ConfigurationError(
            f"{SOURCES_ENV}={folder} is not a folder (it names a folder of source snapshots)"
        )
    found = sorted(
        p for p in root.glob("*.tar.gz") if (m := _SNAPSHOT.search(p.name)) and commit.startswith(m.group(1))
    )
    if not found:
        return None
    if sha256 is None:
        raise ConfigurationError(
            f"{kernel}: {found[0]} is a snapshot of commit {commit[:12]} in {SOURCES_ENV}, but the git source pins "
            f"no sha256 to check it against: set kernels.{kernel}.source.sha256 to the snapshot's sha256"
        )
    for path in found:
        if sha256_file(path) == sha256:
            return path
    raise BuildError(
        f"{kernel}: no snapshot of commit {commit[:12]} in {SOURCES_ENV}={folder} matches the pinned sha256 "
        f"{sha256[:16]}… ({', '.join(p.name for p in found)}); nothing was compiled"
    )


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
        snapshot = git_snapshot(kernel, expected_sha256, src.sha256)
        if snapshot is not None:
            return Source(path=str(snapshot), sha256=sha256_file(snapshot), url=None, subdir=src.subdir or "")
        try:
            archive = git_archive(kernel, src.url, expected_sha256, cache)
        except EnvironmentProblem as exc:
            where = os.environ.get(SOURCES_ENV)
            name = f"<name>-{expected_sha256[:8]}.tar.gz"
            hint = (
                f"{SOURCES_ENV}={where} holds no {name}"
                if where
                else f"offline, set {SOURCES_ENV} to a folder holding its snapshot {name}"
            )
            raise EnvironmentProblem(f"{exc} ({kernel} at commit {expected_sha256[:12]}: {hint})") from None
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
