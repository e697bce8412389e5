"""CUTLASS as a kernel source vendors it (builder/vendored.py): version.h, a content hash, the commit where the
tree knows it; on a synthetic tree and, where it is at hand, on flash-attn 2.8.3's own sdist."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from attnforge.builder.vendored import cutlass_facts, cutlass_version, tree_sha256
from tests.unit.test_stable_abi_patch import fa_sdist

COMMIT = "7127592069c2fe01b041e174ba4345ef9b279671"


def vendored(
    top: Path,
    version: str | None = "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 1\n#define CUTLASS_PATCH 0\n",
) -> Path:
    inc = top / "csrc" / "cutlass" / "include" / "cutlass"
    inc.mkdir(parents=True)
    (inc / "cutlass.h").write_text("// cutlass\n")
    if version is not None:
        (inc / "version.h").write_text(version)
    (top / "hopper").mkdir()
    return top / "csrc" / "cutlass"


def test_an_sdist_without_git_metadata_gives_version_and_hash_not_a_commit(tmp_path: Path) -> None:
    folder = vendored(tmp_path / "fa")
    facts = cutlass_facts(tmp_path / "fa" / "hopper", tmp_path)
    assert facts is not None and facts["version"] == "4.1.0" and facts["commit"] is None
    assert facts["files"] == 2 and facts["tree_sha256"] == tree_sha256(folder)[0]
    # the hash follows the content, not where or when it was unpacked
    (folder / "include" / "cutlass" / "cutlass.h").write_text("// changed\n")
    assert tree_sha256(folder)[0] != facts["tree_sha256"]
    assert cutlass_facts(tmp_path / "fa" / "hopper", tmp_path / "fa" / "hopper") is None  # never above `stop`


def test_a_checkout_gives_its_commit(tmp_path: Path) -> None:
    folder = vendored(tmp_path / "fa")
    gitdir = tmp_path / "fa" / ".git" / "modules" / "csrc" / "cutlass"
    (gitdir / "refs" / "heads").mkdir(parents=True)
    (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
    (gitdir / "refs" / "heads" / "main").write_text(COMMIT + "\n")
    (folder / ".git").write_text("gitdir: ../../.git/modules/csrc/cutlass\n")  # a submodule's .git file
    facts = cutlass_facts(tmp_path / "fa", tmp_path)
    assert facts is not None and facts["commit"] == COMMIT and facts["commit_from"] == "checkout"
    assert facts["files"] == 2  # .git is not content


def test_a_version_header_without_numbers_gives_no_version(tmp_path: Path) -> None:
    folder = vendored(tmp_path / "fa", version="#define CUTLASS_MAJOR 4\n")
    assert cutlass_version(folder) is None
    assert cutlass_version(tmp_path / "nowhere") is None


@pytest.mark.skipif(fa_sdist() is None, reason="flash_attn-2.8.3.tar.gz not found")
def test_flash_attn_2_8_3_vendors_a_cutlass_with_a_version(tmp_path: Path) -> None:
    sdist = fa_sdist()
    assert sdist is not None
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/csrc/cutlass/" in m.name and m.isfile()]
        tar.extractall(tmp_path, members=members)
    (top,) = list(tmp_path.iterdir())
    facts = cutlass_facts(top, tmp_path)
    assert facts is not None and facts["commit"] is None and facts["files"] == len(members)
    assert facts["version"] is not None and facts["version"].count(".") == 2
