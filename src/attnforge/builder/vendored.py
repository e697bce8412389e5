"""What a kernel source vendors, as far as the unpacked tree tells: CUTLASS's version (its
`include/cutlass/version.h`), a content hash of the vendored folder, and its commit where the tree knows it
(a `git` source packed by attnforge records each submodule's commit in `.attnforge-git.json`; a checkout has
`.git`). flash-attn's sdist vendors `csrc/cutlass` without git metadata: there the version and the hash are
what can be known, and the commit stays unknown (the SBOM says so)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

CUTLASS_DIR = "csrc/cutlass"
GIT_RECORD = ".attnforge-git.json"  # written by the host's git source packer (engine/gitsource.py)
_DEFINE = re.compile(r"^\s*#\s*define\s+CUTLASS_(MAJOR|MINOR|PATCH)\s+(\d+)", re.MULTILINE)
_SHA = re.compile(r"[0-9a-f]{40}")


def tree_sha256(folder: Path) -> tuple[str, int]:
    """(sha256 of the sorted `path NUL sha256(file) LF` lines of every file under `folder`, file count);
    a symlink counts as its target text. The same files give the same hash wherever they were unpacked."""
    lines: list[str] = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if ".git" in path.relative_to(folder).parts:
            continue
        if path.is_symlink():
            digest = hashlib.sha256(str(path.readlink()).encode()).hexdigest()
        elif path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            continue
        lines.append(f"{rel}\0{digest}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest(), len(lines)


def cutlass_version(folder: Path) -> str | None:
    """`MAJOR.MINOR.PATCH` from `include/cutlass/version.h`, None when the file or a number is missing."""
    try:
        text = (folder / "include" / "cutlass" / "version.h").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = {k: v for k, v in _DEFINE.findall(text)}
    if not all(k in found for k in ("MAJOR", "MINOR", "PATCH")):
        return None
    return f"{found['MAJOR']}.{found['MINOR']}.{found['PATCH']}"


def _git_head(folder: Path) -> str | None:
    """The commit a checkout's `.git` (a folder, or a submodule's `gitdir:` file) says is checked out."""
    dot = folder / ".git"
    try:
        if dot.is_file():
            target = dot.read_text().strip().removeprefix("gitdir:").strip()
            dot = (folder / target).resolve()
        head = (dot / "HEAD").read_text().strip()
        if head.startswith("ref:"):
            head = (dot / head.removeprefix("ref:").strip()).read_text().strip()
    except OSError:
        return None
    return head if _SHA.fullmatch(head) else None


def _recorded_commit(top: Path, rel: str) -> str | None:
    """The submodule commit `.attnforge-git.json` records for `rel` (a packed git source)."""
    try:
        data = json.loads((top / GIT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    commit = (data.get("submodules") or {}).get(rel) if isinstance(data, dict) else None
    return commit if isinstance(commit, str) and _SHA.fullmatch(commit) else None


def find_top(tree: Path, stop: Path) -> Path | None:
    """The folder at or above `tree` (not above `stop`) that holds `csrc/cutlass` (FA3 builds from hopper/)."""
    for folder in [tree, *tree.parents]:
        if (folder / CUTLASS_DIR).is_dir():
            return folder
        if folder == stop:
            break
    return None


def cutlass_facts(tree: Path, stop: Path) -> dict[str, Any] | None:
    """CUTLASS as the source vendors it (module docstring); None when the source has no `csrc/cutlass`."""
    top = find_top(tree, stop)
    if top is None:
        return None
    folder = top / CUTLASS_DIR
    digest, files = tree_sha256(folder)
    commit = _recorded_commit(top, CUTLASS_DIR) or _git_head(folder)
    return {
        "path": CUTLASS_DIR,
        "version": cutlass_version(folder),
        "tree_sha256": digest,
        "files": files,
        "commit": commit,
        "commit_from": (
            "git source record" if _recorded_commit(top, CUTLASS_DIR) else "checkout" if commit else None
        ),
    }
