"""Yanking (PEP 592) on the static index: the pages it changes, its atomicity, its refusals."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.matrix.destinations import Destination
from attnforge.publish.coverage_page import CoveragePage
from attnforge.publish.index import ALL, MARKER, Bundle, FileRecord, StaticIndex
from attnforge.publish.yank import refuse_unsupported, set_yanked
from tests.unit.test_wheels_index import digest, make_bundle

A = "cu130torch2.14cxx11abiTRUE"
B = "cu130torch2.13cxx11abiTRUE"


def published(tmp_path: Path) -> tuple[StaticIndex, Bundle, Bundle]:
    a, b = make_bundle(tmp_path / "in", A), make_bundle(tmp_path / "in", B)
    index = StaticIndex(tmp_path / "w" / "index", root_page=CoveragePage())
    index.publish([a, b])
    return index, a, b


def pages(index: StaticIndex) -> dict[str, bytes]:
    """Every PEP 503/691 page of the index (not the coverage page, which carries the time it was made)."""
    root = index.root.resolve()
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("simple/**/index.*")}


def files_of(index: StaticIndex, variant: str) -> dict[str, dict[str, object]]:
    page = json.loads((index.root / variant / "simple" / "flash-attn" / "index.json").read_text())
    return {f["filename"]: f for f in page["files"]}


def test_yank_marks_both_apis_in_every_tree_and_unyank_restores_the_pages(tmp_path: Path) -> None:
    index, a, b = published(tmp_path)
    before, generation = pages(index), os.readlink(index.root)
    inode = (index.root / ALL / "simple" / "flash-attn" / a.filename).stat().st_ino
    result = set_yanked(index, str(a.wheel), 'segfaults on "long" sequences <8k')  # a path names its file
    assert result.generation is not None and os.readlink(index.root) == result.generation != generation
    for variant in ("cu130-torch2.14", ALL):
        files = files_of(index, variant)
        assert files[a.filename]["yanked"] == 'segfaults on "long" sequences <8k'
        html = (index.root / variant / "simple" / "flash-attn" / "index.html").read_text()
        (link,) = [line for line in html.splitlines() if a.filename + "</a>" in line]
        assert link.endswith(
            'data-yanked="segfaults on &quot;long&quot; sequences &lt;8k">' + a.filename + "</a><br>"
        )
    assert files_of(index, ALL)[b.filename]["yanked"] is False
    assert (
        "data-yanked"
        not in (index.root / "cu130-torch2.13" / "simple" / "flash-attn" / "index.html").read_text()
    )
    record = json.loads((index.root / MARKER).read_text())["files"][a.filename]
    assert record["yanked"] == 'segfaults on "long" sequences <8k' and record["yanked_time"].endswith("Z")
    # the files themselves are kept, not copied: the same inode in the new generation
    assert (index.root / ALL / "simple" / "flash-attn" / a.filename).stat().st_ino == inode
    # the coverage page says so
    assert "segfaults on &quot;long&quot; sequences &lt;8k" in (index.root / "index.html").read_text()

    # the same yank again: nothing to do, no new generation; another reason replaces the first
    again = set_yanked(index, a.filename, 'segfaults on "long" sequences <8k')
    assert again.generation is None and "already yanked" in again.describe()
    set_yanked(index, a.filename, "wrong results")
    assert files_of(index, ALL)[a.filename]["yanked"] == "wrong results"

    # unyank: the pages are again what publish wrote, byte for byte
    assert set_yanked(index, a.filename, None).generation is not None
    assert pages(index) == before
    assert set_yanked(index, a.filename, None).generation is None


@pytest.mark.parametrize(
    ("wheel", "reason", "message"),
    [
        ("flash_attn-2.8.3+cu130torch2.12cxx11abiTRUE-cp311-cp311-linux_x86_64.whl", "x", "did you mean"),
        ("nothing.whl", "x", "not in the index at"),
        ("flash_attn-2.8.3.tar.gz", "x", "not a wheel file name"),
        (f"flash_attn-2.8.3+{A}-cp311-cp311-linux_x86_64.whl", "  ", "--reason is empty"),
    ],
)
def test_bad_input_is_refused_naming_it_and_changes_nothing(
    tmp_path: Path, wheel: str, reason: str, message: str
) -> None:
    index, _, _ = published(tmp_path)
    before = digest(index.root)
    with pytest.raises(ConfigurationError, match=message) as exc:
        set_yanked(index, wheel, reason)
    assert exc.value.exit_code == 2
    assert digest(index.root) == before


def test_a_yank_that_fails_while_writing_leaves_the_old_index_and_no_debris(tmp_path: Path) -> None:
    index, a, _ = published(tmp_path)
    before = digest(index.root)
    listing = sorted(p.name for p in index.parent.iterdir())

    def broken_page(gen: Path, previous: Path | None, records: dict[str, FileRecord]) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        set_yanked(StaticIndex(index.root, root_page=broken_page), a.filename, "bad")
    assert digest(index.root) == before
    assert sorted(p.name for p in index.parent.iterdir()) == listing


def test_pypiserver_and_registry_destinations_are_refused() -> None:
    server = Destination(kind="pypiserver", url="http://pypi.internal:8080")
    with pytest.raises(
        PublishError, match=r"'internal' is a pypiserver .*: it has no yank \(PEP 592\)"
    ) as exc:
        refuse_unsupported(server, "internal")
    assert exc.value.exit_code == 7
    with pytest.raises(ConfigurationError, match="wheels are yanked on a 'static' index"):
        refuse_unsupported(Destination(kind="registry", url="https://registry.internal"), "images")
    refuse_unsupported(Destination(kind="static", path="wheels/index"), "local")


def test_cli_yank_and_unyank(tmp_path: Path, run_cli: Callable[..., tuple[int, str, str]]) -> None:
    index, a, _ = published(tmp_path)
    matrix = tmp_path / "no-matrix.yaml"  # the commands work on a folder without a matrix
    code, _, err = run_cli(
        "--matrix", str(matrix), "yank", a.filename, "--reason", "bad", "--to", str(index.root)
    )
    assert code == 0 and f"{a.filename}: now yanked (bad) in {index.root}" in err
    assert files_of(index, ALL)[a.filename]["yanked"] == "bad"
    code, _, err = run_cli("--matrix", str(matrix), "unyank", a.filename, "--to", str(index.root))
    assert code == 0 and "now not yanked" in err
    code, _, err = run_cli(
        "--matrix", str(matrix), "yank", a.filename, "--reason", "bad", "--to", "http://127.0.0.1:9/"
    )
    assert code == 7 and "no yank (PEP 592)" in err
    code, _, err = run_cli("--matrix", str(matrix), "yank", a.filename, "--to", str(index.root))
    assert code == 2 and "--reason" in err


def test_doctor_yank_check_over_http(tmp_path: Path) -> None:
    """`doctor --index-url`: warn for a yanked installed version, ok when offered, skip when not answerable."""
    import threading

    from attnforge.client.yank_status import yank_check
    from attnforge.engine.environment import Env
    from attnforge.publish.index_server import make_server
    from tests.unit.test_wheels_resolver import probe

    index, a, b = published(tmp_path)
    set_yanked(index, a.filename, "wrong results")
    server = make_server(index.root)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    env = Env.from_probe(probe())
    try:
        version_a, version_b = a.filename.split("-")[1], b.filename.split("-")[1]
        warn = yank_check(url, "flash-attn", version_a.lower(), env)  # as pip records it: lower case
        assert (warn.status, warn.name) == ("warn", "yanked")
        assert warn.detail.startswith(f"{a.filename} was yanked from {url}: wrong results;")
        assert yank_check(url, "flash-attn", version_b, env).status == "ok"
        missing = yank_check(url, "flash-attn", "2.8.3+cu126torch2.7cxx11abiTRUE", env)
        assert missing.status == "skip" and "is not in the index" in missing.detail
        assert yank_check(url, "flash-attn-3", version_a, env).status == "skip"
    finally:
        server.shutdown()
        server.server_close()
    down = yank_check(url, "flash-attn", version_a, env)
    assert down.status == "skip" and down.detail.startswith("index not readable")
