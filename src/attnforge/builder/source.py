"""The kernel's source: fetch (when a URL is given), verify the sha256, unpack once and patch.

A rerun with the same archive and patches resumes in the unpacked tree (ninja then skips finished
objects); anything else unpacks afresh.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

from .exits import EXIT_CONFIG, BuildFailure
from .files import sha256_file
from .patches import apply_patch, check_requires, patch_digest, patches_dir
from .report import Reporter
from .spec import BuildSpec

STATE_FILE = "attnforge-state.json"
ZIP_EPOCH = 315532800  # 1980-01-01


def fetch_source(spec: BuildSpec, rep: Reporter) -> Path:
    """The verified archive, downloaded from ``source.url`` first when the file is absent."""
    src = spec.source
    path = Path(src.path)
    if not path.is_file() and src.url:
        import urllib.request

        path.parent.mkdir(parents=True, exist_ok=True)
        rep.line(f"downloading {src.url}")
        tmp = path.with_name(path.name + f".part{os.getpid()}")
        with urllib.request.urlopen(src.url, timeout=120) as resp, open(tmp, "wb") as out:
            shutil.copyfileobj(resp, out)
        os.replace(tmp, path)
    if not path.is_file():
        raise BuildFailure(EXIT_CONFIG, f"source {path} does not exist")
    digest = sha256_file(path)
    if digest != src.sha256.lower():
        raise BuildFailure(EXIT_CONFIG, f"sha256 mismatch for {path}: expected {src.sha256}, got {digest}")
    return path


def safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract, refusing members or links that would land outside ``dest``."""
    root = dest.resolve()
    for member in tar.getmembers():
        target = (dest / member.name).resolve()
        if root != target and root not in target.parents:
            raise BuildFailure(EXIT_CONFIG, f"unsafe path in the source archive: {member.name}")
        if member.issym() or member.islnk():
            base = root if member.islnk() else target.parent
            link = (base / member.linkname).resolve()
            if root != link and root not in link.parents:
                raise BuildFailure(EXIT_CONFIG, f"unsafe link in the source archive: {member.name}")
    if sys.version_info >= (3, 12):
        tar.extractall(dest, filter="data")
    else:
        tar.extractall(dest)  # members checked above


def archive_epoch(path: Path) -> int:
    """A stable SOURCE_DATE_EPOCH: the mtime of the sdist's PKG-INFO, else of the archive's top folder."""
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    for member in members:
        if member.name.count("/") == 1 and member.name.endswith("/PKG-INFO"):
            return int(member.mtime)
    tops = [m for m in members if m.isdir() and m.name.strip("/").count("/") == 0]
    return int(tops[0].mtime) if tops and tops[0].mtime else ZIP_EPOCH


def prepare_tree(spec: BuildSpec, archive: Path, patches: list[str], rep: Reporter) -> Path:
    """Unpack + patch into build_dir/src, unless a tree for the same source and patches is there; returns
    the folder holding setup.py (``source.subdir`` inside the archive's top folder)."""
    build_dir = Path(spec.build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    state_path = build_dir / STATE_FILE
    pdir = patches_dir()
    check_requires(pdir, patches)
    want = {
        "source_sha256": spec.source.sha256.lower(),
        "subdir": spec.source.subdir,
        "patches": patches,
        "patch_digest": patch_digest(pdir, patches),
    }
    src_root = build_dir / "src"
    if state_path.is_file():
        try:
            have = json.loads(state_path.read_text(encoding="utf-8"))
        except ValueError:
            have = {}
        tree = Path(have.get("tree", ""))
        if all(have.get(k) == v for k, v in want.items()) and tree.is_dir():
            rep.line(f"attnforge: reusing unpacked tree {tree} (resume)")
            return tree
        rep.line("attnforge: source or patches changed; unpacking afresh")
    if src_root.exists():
        shutil.rmtree(src_root)
    src_root.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        safe_extract(tar, src_root)
    entries = [p for p in src_root.iterdir() if p.is_dir()]
    top = entries[0] if len(entries) == 1 else src_root
    tree = top / spec.source.subdir if spec.source.subdir else top
    if not (tree / "setup.py").is_file() and not (tree / "pyproject.toml").is_file():
        where = f"{archive.name}/{spec.source.subdir}" if spec.source.subdir else archive.name
        raise BuildFailure(EXIT_CONFIG, f"no setup.py or pyproject.toml in {where}")
    for name in patches:
        apply_patch(top, pdir, name, spec, rep)
    want["tree"] = str(tree)
    state_path.write_text(json.dumps(want, indent=1), encoding="utf-8")
    return tree
