"""The static index: pages, atomic generations, conflicts, locking, and `serve`'s content negotiation."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnforge.core.errors import ConfigurationError, PublishError
from attnforge.publish.index import ALL, MARKER, Bundle, StaticIndex, check_conflicts
from attnforge.publish.index_server import make_server, negotiate
from attnforge.wheels.wheelio import Member, write_wheel

JSON = "application/vnd.pypi.simple.v1+json"


def make_bundle(
    where: Path, local: str, plat: str = "linux_x86_64", body: bytes = b"", variant: str = ""
) -> Bundle:
    version = f"2.8.3+{local}"
    dist_info = f"flash_attn-{version}.dist-info"
    name = f"flash_attn-{version}-cp311-cp311-{plat}.whl"
    members = {
        "flash_attn/__init__.py": Member(b"x = 1\n" + body),
        f"{dist_info}/METADATA": Member(
            f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\nRequires-Python: >=3.9\n"
            "Requires-Dist: torch==2.14.*\n\n".encode()
        ),
        f"{dist_info}/WHEEL": Member(
            f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-{plat}\n".encode()
        ),
    }
    wheel = write_wheel(where, name, dist_info, members, 1700000000)
    data = wheel.read_bytes()
    manifest = {
        "kernel_version": "2.8.3",
        "variant": variant or "cu130-torch" + local.split("torch")[1].split("cxx")[0],
        "wheel": name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "inputs": {"toolkit": "cuda13.0", "torch": "2.14.1", "python": "3.11", "cxx11_abi": True},
        "finalize": {},
    }
    return Bundle(wheel=wheel, manifest=manifest)


def digest(root: Path) -> dict[str, str]:
    out = {"<target>": os.readlink(root) if root.is_symlink() else "<dir>"}
    for p in sorted(root.resolve().rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root.resolve()))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_publish_writes_pep503_691_658_per_variant_and_all(tmp_path: Path) -> None:
    a = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    b = make_bundle(tmp_path / "in", "cu130torch2.13cxx11abiTRUE")
    index = StaticIndex(tmp_path / "wheels" / "index")
    report = index.publish([a, b])
    assert sorted(report.added) == sorted([a.filename, b.filename])
    root = tmp_path / "wheels" / "index"
    assert root.is_symlink() and os.readlink(root).startswith(".index.gen-")
    for variant, files in (("cu130-torch2.14", [a]), ("cu130-torch2.13", [b]), (ALL, [a, b])):
        proj = root / variant / "simple" / "flash-attn"
        page = json.loads((proj / "index.json").read_text())
        assert page["meta"]["api-version"] == "1.1"
        assert sorted(f["filename"] for f in page["files"]) == sorted(x.filename for x in files)
        for f in page["files"]:
            wheel = proj / f["filename"]
            assert hashlib.sha256(wheel.read_bytes()).hexdigest() == f["hashes"]["sha256"]
            meta = (proj / (f["filename"] + ".metadata")).read_bytes()
            assert hashlib.sha256(meta).hexdigest() == f["core-metadata"]["sha256"]
            assert f["requires-python"] == ">=3.9"
            assert (
                json.loads((proj / (f["filename"] + ".manifest.json")).read_text())["sha256"]
                == f["hashes"]["sha256"]
            )
        html = (proj / "index.html").read_text()
        assert html.count("data-core-metadata=") == len(files) and "%2B" in html
        roots = json.loads((root / variant / "simple" / "index.json").read_text())
        assert roots["projects"] == [{"name": "flash-attn"}]
    # one copy on disk: the variant tree and `all` share inodes
    s1 = (root / "cu130-torch2.14" / "simple" / "flash-attn" / a.filename).stat()
    s2 = (root / ALL / "simple" / "flash-attn" / a.filename).stat()
    assert s1.st_ino == s2.st_ino


def test_same_bytes_noop_other_bytes_refused(tmp_path: Path) -> None:
    a = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    index = StaticIndex(tmp_path / "index")
    index.publish([a])
    before = digest(index.root)
    again = index.publish([a])
    assert again.unchanged == [a.filename] and again.generation is None
    assert digest(index.root) == before
    changed = make_bundle(tmp_path / "other", "cu130torch2.14cxx11abiTRUE", body=b"# different\n")
    with pytest.raises(PublishError, match="already published with other bytes"):
        index.publish([changed])
    # the same version for the same Python and arch under another platform tag is refused too
    retagged = make_bundle(tmp_path / "retag", "cu130torch2.14cxx11abiTRUE", plat="manylinux_2_34_x86_64")
    with pytest.raises(PublishError, match="version already published"):
        index.publish([retagged])
    assert digest(index.root) == before


def test_failure_while_writing_leaves_the_old_index_and_no_debris(tmp_path: Path) -> None:
    a = make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")
    index = StaticIndex(tmp_path / "w" / "index")
    index.publish([a])
    before = digest(index.root)
    listing = sorted(p.name for p in (tmp_path / "w").iterdir())
    bad = make_bundle(tmp_path / "bad", "cu130torch2.13cxx11abiTRUE")
    bad.wheel.write_bytes(b"not a zip")
    bad.manifest["sha256"] = hashlib.sha256(b"not a zip").hexdigest()
    with pytest.raises(PublishError, match="not a readable wheel"):
        index.publish([make_bundle(tmp_path / "ok", "cu130torch2.12cxx11abiTRUE"), bad])
    assert digest(index.root) == before
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == listing
    # bytes changed after finalize (manifest hash stale): refused while copying
    stale = make_bundle(tmp_path / "stale", "cu130torch2.11cxx11abiTRUE")
    stale.manifest["sha256"] = "0" * 64
    with pytest.raises(PublishError, match="bytes changed since finalize"):
        index.publish([stale])
    assert digest(index.root) == before


def test_stale_generations_from_killed_publishes_are_swept(tmp_path: Path) -> None:
    index = StaticIndex(tmp_path / "index")
    index.publish([make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")])
    first = os.readlink(index.root)
    (tmp_path / ".index.gen-killed").mkdir()
    (tmp_path / ".index.link-123-abc").symlink_to("nowhere")
    index.publish([make_bundle(tmp_path / "in2", "cu130torch2.13cxx11abiTRUE")])
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".index."))
    assert names == sorted([".index.lock", first, os.readlink(index.root)])  # current + previous kept
    marker = json.loads((index.root / MARKER).read_text())
    assert marker["previous"] == first and len(marker["files"]) == 2


def test_plain_directory_index_is_adopted_and_foreign_folder_refused(tmp_path: Path) -> None:
    index = StaticIndex(tmp_path / "index")
    index.publish([make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")])
    # someone copied the index as a plain folder (rsync without links): still publishable
    real = index.root.resolve()
    index.root.unlink()
    os.rename(real, index.root)
    index.publish([make_bundle(tmp_path / "in2", "cu130torch2.13cxx11abiTRUE")])
    assert index.root.is_symlink() and len(index.records()) == 2
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(ConfigurationError, match="not an attnforge index"):
        StaticIndex(foreign).publish([make_bundle(tmp_path / "in3", "cu130torch2.12cxx11abiTRUE")])


def test_check_conflicts_within_one_publish() -> None:
    name = "flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"
    with pytest.raises(PublishError, match="given twice with different bytes"):
        check_conflicts({}, [(name, "a" * 64), (name, "b" * 64)])
    arm = name.replace("x86_64", "aarch64")
    assert check_conflicts({name: "a" * 64}, [(arm, "c" * 64)]) == ([arm], [])


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, "index.html"),
        ("", "index.html"),
        (f"{JSON}, application/vnd.pypi.simple.v1+html;q=0.1, text/html;q=0.01", "index.json"),  # pip
        ("application/vnd.pypi.simple.latest+json", "index.json"),
        ("text/html,application/xhtml+xml,*/*;q=0.8", "index.html"),  # a browser
        ("*/*", "index.html"),
        (f"{JSON};q=0.2, text/html", "index.html"),
        ("application/*", "index.json"),
        ("application/xml", None),
        (f"{JSON};q=0", None),
    ],
)
def test_negotiation(accept: str | None, expected: str | None) -> None:
    choice = negotiate(accept, {"index.json", "index.html"})
    assert (choice[0] if choice else None) == expected


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    index = StaticIndex(tmp_path / "index")
    index.publish([make_bundle(tmp_path / "in", "cu130torch2.14cxx11abiTRUE")])
    server = make_server(index.root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def fetch(url: str, accept: str | None = None) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), b""


def test_serve_negotiates_over_http(served: str) -> None:
    status, ctype, body = fetch(f"{served}/all/simple/flash-attn/", JSON)
    assert (status, ctype) == (200, JSON) and json.loads(body)["name"] == "flash-attn"
    assert fetch(f"{served}/all/simple/flash-attn/")[1] == "text/html; charset=utf-8"
    assert fetch(f"{served}/all/simple/flash-attn/?format={JSON}")[1] == JSON
    assert fetch(f"{served}/all/simple/flash-attn/", "image/png")[0] == 406
    assert fetch(f"{served}/all/simple/nothing/")[0] == 404
    assert fetch(f"{served}/all/simple/flash-attn")[0] == 200  # redirected to the folder
