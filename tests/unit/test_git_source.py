"""`source: {kind: git}` with real git on local repositories shaped like flash-attention (a hopper/ folder and the
cutlass submodule): `attnforge lock` pins the ref's commit, the host packs commit + submodule into a reproducible
archive the builder unpacks and patches like any other, and an unpinned ref is refused."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from attnforge.builder.files import sha256_file
from attnforge.builder.vendored import cutlass_facts
from attnforge.core.errors import ConfigurationError
from attnforge.engine.sources import fetch_source
from attnforge.matrix.schema import KernelSpec, SourceSpec
from attnforge.matrix.source_lock import git_commit, source_sha256


def git(*args: str, cwd: Path) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e",
        "GIT_AUTHOR_DATE": "2026-08-15T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-08-15T00:00:00Z",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", "-c", "protocol.file.allow=always", *args],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("git")
    cutlass = root / "cutlass"
    (cutlass / "include" / "cutlass").mkdir(parents=True)
    (cutlass / "include" / "cutlass" / "cutlass.h").write_text("// cutlass\n")
    (cutlass / "include" / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 3\n#define CUTLASS_MINOR 9\n#define CUTLASS_PATCH 2\n"
    )
    git("init", "-q", "-b", "main", cwd=cutlass)
    git("add", ".", cwd=cutlass)
    git("commit", "-q", "-m", "cutlass", cwd=cutlass)
    fa = root / "flash-attention"
    (fa / "hopper").mkdir(parents=True)
    (fa / "hopper" / "setup.py").write_text("# setup\n")
    (fa / "hopper" / "run.sh").write_text("#!/bin/sh\n")
    (fa / "hopper" / "run.sh").chmod(0o755)
    git("init", "-q", "-b", "main", cwd=fa)
    git("submodule", "add", "-q", str(cutlass), "csrc/cutlass", cwd=fa)
    git("add", ".", cwd=fa)
    git("commit", "-q", "-m", "fa3", cwd=fa)
    git("tag", "-a", "v3.0.0", "-m", "release", cwd=fa)
    for repo in (fa, cutlass):  # what GitHub allows: fetching a reachable commit by its id
        git("config", "uploadpack.allowReachableSHA1InWant", "true", cwd=repo)
    return fa, git("rev-parse", "HEAD", cwd=fa)


def test_lock_resolves_a_tag_to_its_commit(upstream: tuple[Path, str]) -> None:
    fa, commit = upstream
    assert git_commit(f"file://{fa}", "v3.0.0") == commit
    assert git_commit(f"file://{fa}", commit) == commit
    with pytest.raises(ConfigurationError, match="no ref 'v9'"):
        git_commit(f"file://{fa}", "v9")


def test_the_pinned_commit_becomes_a_reproducible_archive(upstream: tuple[Path, str], tmp_path: Path) -> None:
    fa, commit = upstream
    spec = KernelSpec(
        version="3.0.0", source=SourceSpec(kind="git", url=f"file://{fa}", ref="v3.0.0", subdir="hopper")
    )
    lock = {"flash-attn-3": {"3.0.0": {"commit": commit}}}
    pin = source_sha256("flash-attn-3", spec, None, lock)  # type: ignore[arg-type]
    assert pin == commit
    a = fetch_source("flash-attn-3", spec, pin, tmp_path / "c1", tmp_path)
    b = fetch_source("flash-attn-3", spec, pin, tmp_path / "c2", tmp_path)
    assert a.sha256 == b.sha256 == sha256_file(Path(a.path)) and a.subdir == "hopper"
    with tarfile.open(a.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    top = f"flash-attn-3-{commit[:12]}"
    assert f"{top}/csrc/cutlass/include/cutlass/cutlass.h" in members  # the submodule at its pinned commit
    assert f"{top}/hopper/setup.py" in members and not any(".git" in n.split("/") for n in members)
    assert members[f"{top}/hopper/run.sh"].mode == 0o755 and members[f"{top}/hopper/setup.py"].mode == 0o644
    assert {m.uid for m in members.values()} == {0} and len({m.mtime for m in members.values()}) == 1
    # the submodule's pinned commit survives the packing (no .git in the archive) and reaches the SBOM's facts
    with tarfile.open(a.path) as tar:
        tar.extractall(tmp_path / "unpacked")
    facts = cutlass_facts(tmp_path / "unpacked" / top / "hopper", tmp_path / "unpacked")
    cutlass_head = git("rev-parse", "HEAD", cwd=fa.parent / "cutlass")
    assert (
        facts is not None and facts["commit"] == cutlass_head and facts["commit_from"] == "git source record"
    )
    assert facts["version"] == "3.9.2" and facts["files"] == 2 and facts["path"] == "csrc/cutlass"


def test_an_unpinned_ref_is_refused(upstream: tuple[Path, str], tmp_path: Path) -> None:
    fa, _ = upstream
    spec = KernelSpec(
        version="3.0.0", source=SourceSpec(kind="git", url=f"file://{fa}", ref="main", subdir="hopper")
    )
    assert source_sha256("flash-attn-3", spec, None, {}) is None  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="is not pinned to a commit: run `attnforge lock`"):
        fetch_source("flash-attn-3", spec, None, tmp_path, tmp_path)
