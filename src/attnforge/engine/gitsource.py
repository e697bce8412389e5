"""A `git` kernel source on the host: the pinned commit and the submodules the kernel needs (kernels.json
`git_submodules`, e.g. FA3's csrc/cutlass), fetched shallowly and packed into a reproducible source archive in
the cache. The builder then takes it like any archive and never runs git (builds have no network).

The archive (`<kernel>-git-<commit12>.tar.gz`, top folder `<kernel>-<commit12>/`) holds the work tree without
`.git`, plus `.attnforge-git.json` naming the commit and each submodule's pinned commit: members sorted, owner 0, mode 644/755, every mtime the commit's time, gzip without a timestamp, so the
same commit gives the same bytes (its sha256 is what the build records).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from attnforge.builder.vendored import GIT_RECORD
from attnforge.core.errors import BuildError, EnvironmentProblem
from attnforge.core.kernels import facts


def _git(*args: str, cwd: Path | None = None) -> str:
    # a submodule given as a local path (tests, mirrors on a file share) needs the file protocol allowed
    cmd = ["git", "-c", "protocol.file.allow=always", "-c", "advice.detachedHead=false", *args]
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentProblem(f"git {' '.join(args[:2])}: {exc}") from None
    if proc.returncode != 0:
        raise EnvironmentProblem(f"git {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def checkout(url: str, commit: str, submodules: list[str], dest: Path) -> int:
    """Fetch `commit` of `url` (depth 1) into `dest` with `submodules` at their pinned commits; returns the
    commit time."""
    _git("init", "-q", str(dest))
    _git("fetch", "-q", "--depth", "1", url, commit, cwd=dest)
    _git("checkout", "-q", "FETCH_HEAD", cwd=dest)
    head = _git("rev-parse", "HEAD", cwd=dest)
    if head != commit:
        raise BuildError(f"{url}: fetched {head}, not the pinned commit {commit}")
    if submodules:
        _git("submodule", "update", "--init", "--depth", "1", "--", *submodules, cwd=dest)
    return int(_git("log", "-1", "--format=%ct", cwd=dest))


def record_commits(repo: Path, commit: str, submodules: list[str]) -> None:
    """Write `.attnforge-git.json` at the tree's top: the commit and each submodule's pinned commit (the
    superproject's gitlink), which the archive otherwise loses with `.git` (the builder reads it for the SBOM)."""
    pins = {path: _git("rev-parse", f"HEAD:{path}", cwd=repo) for path in submodules}
    record = {"commit": commit, "submodules": pins}
    (repo / GIT_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def pack(tree: Path, top: str, epoch: int, out: Path) -> None:
    """Write `tree` (without any .git) as a reproducible .tar.gz with top folder `top`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in [tree, *sorted(tree.rglob("*"))]:
            rel = path.relative_to(tree)
            if ".git" in rel.parts:
                continue
            info = tarfile.TarInfo(str(Path(top) / rel) if rel.parts else top)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            if path.is_symlink():
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
                tar.addfile(info)
            elif path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                data = path.read_bytes()
                info.size, info.mode = len(data), 0o755 if os.access(path, os.X_OK) else 0o644
                tar.addfile(info, io.BytesIO(data))
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())


def git_archive(kernel: str, url: str, commit: str, cache: Path) -> Path:
    """The cached archive of `commit` (made on first use)."""
    sources = cache / "sources"
    dest = sources / f"{kernel}-git-{commit[:12]}.tar.gz"
    if dest.is_file():
        return dest
    sources.mkdir(parents=True, exist_ok=True)
    submodules = [str(s) for s in facts(kernel).get("git_submodules", [])]
    with tempfile.TemporaryDirectory(prefix=".git-", dir=sources) as tmp:
        repo = Path(tmp) / "repo"
        epoch = checkout(url, commit, submodules, repo)
        record_commits(repo, commit, submodules)
        part = Path(tmp) / dest.name
        pack(repo, f"{kernel}-{commit[:12]}", epoch, part)
        os.replace(part, dest)
    return dest
