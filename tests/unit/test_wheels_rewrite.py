"""Wheel reading (RECORD verified) and reproducible writing (RECORD regenerated), metadata rewriting."""

from __future__ import annotations

import email.policy
import zipfile
from email.parser import BytesParser
from pathlib import Path

import pytest

from attnforge.core.errors import BuildError
from attnforge.wheels.finalize import _rewrite_metadata
from attnforge.wheels.naming import expected_names
from attnforge.wheels.wheelio import ZIP_EPOCH, Member, read_wheel, source_date_epoch, write_wheel

NAME = "flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"
DIST_INFO = "flash_attn-2.8.3+cu130torch2.14cxx11abiTRUE.dist-info"


def members() -> dict[str, Member]:
    return {
        "flash_attn/__init__.py": Member(b"__version__ = '2.8.3'\n"),
        "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so": Member(b"\x7fELF fake", executable=True),
        f"{DIST_INFO}/METADATA": Member(b"Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3\n\n"),
        f"{DIST_INFO}/WHEEL": Member(
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n"
        ),
    }


def test_write_is_reproducible_and_record_complete(tmp_path: Path) -> None:
    a = write_wheel(tmp_path / "a", NAME, DIST_INFO, members(), 1700000000)
    b = write_wheel(tmp_path / "b", NAME, DIST_INFO, dict(reversed(list(members().items()))), 1700000000)
    assert a.read_bytes() == b.read_bytes()
    c = write_wheel(tmp_path / "c", NAME, DIST_INFO, members(), 1700000002)
    assert c.read_bytes() != a.read_bytes()
    with zipfile.ZipFile(a) as zf:
        names = zf.namelist()
        record = zf.read(f"{DIST_INFO}/RECORD").decode()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
    assert names[-1] == f"{DIST_INFO}/RECORD" and names[:2] == sorted(names[:2])
    assert modes["flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"] == 0o755
    assert modes["flash_attn/__init__.py"] == 0o644
    assert all(n in record for n in members()) and f"{DIST_INFO}/RECORD,," in record
    back = read_wheel(a)
    assert {n: m.data for n, m in back.members.items()} == {n: m.data for n, m in members().items()}
    assert back.toplevel() == ["flash_attn", "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"]


def test_read_refuses_a_member_that_does_not_match_record(tmp_path: Path) -> None:
    good = write_wheel(tmp_path, NAME, DIST_INFO, members(), ZIP_EPOCH)
    bad = tmp_path / "bad" / NAME
    bad.parent.mkdir()
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "flash_attn/__init__.py":
                data = b"tampered\n"
            zout.writestr(info, data)
    with pytest.raises(BuildError, match="Hash mismatch"):
        read_wheel(bad)


def test_source_date_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert source_date_epoch() == ZIP_EPOCH
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert source_date_epoch() == 1700000000
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(BuildError):
        source_date_epoch()


def test_metadata_gets_the_local_version_and_an_exact_torch_pin() -> None:
    names = expected_names(
        {
            "kernel_version": "2.8.3",
            "inputs": {"toolkit": "cuda13.0", "torch": "2.14.1", "python": "3.11", "cxx11_abi": True},
        }
    )
    raw = (
        b"Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3\nRequires-Dist: torch>=2.0\n"
        b"Requires-Dist: einops\nRequires-Dist: torch; extra == 'x'\n\n"
    )
    msg = BytesParser(policy=email.policy.compat32).parsebytes(raw)
    changes: list[str] = []
    out = BytesParser(policy=email.policy.compat32).parsebytes(_rewrite_metadata(msg, names, changes))
    assert out["Version"] == "2.8.3+cu130torch2.14cxx11abiTRUE"
    assert out.get_all("Requires-Dist") == ["torch==2.14.*", "einops", "torch; extra == 'x'"]
    assert changes == ["Requires-Dist: torch>=2.0 -> torch==2.14.*"]
    bare = BytesParser(policy=email.policy.compat32).parsebytes(
        b"Metadata-Version: 2.1\nName: x\nVersion: 1\n\n"
    )
    changes = []
    out = BytesParser(policy=email.policy.compat32).parsebytes(_rewrite_metadata(bare, names, changes))
    assert out.get_all("Requires-Dist") == ["torch==2.14.*"] and changes == [
        "Requires-Dist: added torch==2.14.*"
    ]
