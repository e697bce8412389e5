"""A stable-ABI wheel checked under a newer torch (the CPU import/trace check, `parity trace`) gets that torch
listed for its file: the check is kept beside the wheel, published with it (also when the wheel itself is
already on the index), named on the coverage page's row and in coverage.json; `which --torch 2.15` on a
machine without that torch proposes the same file (PyPI's torch 2.15 is a cu132 build)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from attnforge.cli import main
from attnforge.client.which import resolve, with_torch
from attnforge.core.errors import ConfigurationError
from attnforge.engine.environment import Env
from attnforge.matrix.compat import load_compat
from attnforge.publish.coverage import COVERAGE_JSON
from attnforge.publish.coverage_page import CoveragePage
from attnforge.publish.index import Bundle, StaticIndex
from attnforge.publish.record_gate import attach_torch_checks
from attnforge.wheels.torch_checks import TorchCheck, add_check, checks_path, read_checks
from attnforge.wheels.wheelio import Member, write_wheel
from tests.unit.test_fa2_stable_plan import INPUTS, LOCAL
from tests.unit.test_wheels_resolver import probe

CHECK_215 = TorchCheck("2.15.0+cu132", "3.12", "cpu-import-trace", True, "2026-11-28T11:00:00Z")


def _wheel(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    version = f"2.8.3+{LOCAL}"
    dist_info = f"flash_attn-{version}.dist-info"
    name = f"flash_attn-{version}-cp310-abi3-manylinux_2_34_x86_64.whl"
    members = {
        "flash_attn/__init__.py": Member(b"x = 1\n"),
        f"{dist_info}/METADATA": Member(
            f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\nRequires-Python: >=3.10\n"
            "Requires-Dist: torch>=2.10\n\n".encode()
        ),
        f"{dist_info}/WHEEL": Member(
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp310-abi3-manylinux_2_34_x86_64\n"
        ),
    }
    wheel = write_wheel(tmp_path / "in", name, dist_info, members, 1700000000)
    blob = wheel.read_bytes()
    manifest = {
        "kernel": "flash-attn",
        "kernel_version": "2.8.3",
        "variant": "cu130-sm90-torch2.10abi3",
        "wheel": name,
        "sha256": hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
        "inputs": dict(INPUTS),
        "finalize": {},
    }
    return wheel, manifest


def _bundle(wheel: Path, manifest: dict[str, object]) -> Bundle:
    b = Bundle(wheel=wheel, manifest=dict(manifest))
    attach_torch_checks([b])
    return b


def test_checks_are_bound_to_the_wheel_bytes(tmp_path: Path) -> None:
    wheel, manifest = _wheel(tmp_path)
    sha = str(manifest["sha256"])
    add_check(wheel, sha, CHECK_215)
    add_check(
        wheel, sha, TorchCheck("2.15.0+cu132", "3.12", "cpu-import-trace", True, "2026-11-29T00:00:00Z")
    )
    (only,) = read_checks(wheel, sha)  # same torch, Python and kind: replaced
    assert only.date.startswith("2026-11-29") and only.family == "2.15"
    assert read_checks(wheel, "0" * 64) == []  # about other bytes: not this wheel's
    with pytest.raises(ConfigurationError, match="kind"):
        add_check(wheel, sha, TorchCheck("2.15.0", "3.12", "guess", True, ""))


def test_published_wheel_lists_the_newly_checked_torch(tmp_path: Path) -> None:
    wheel, manifest = _wheel(tmp_path)
    index = StaticIndex(tmp_path / "index", root_page=CoveragePage())
    first = index.publish([_bundle(wheel, manifest)])
    assert first.added == [wheel.name]
    # the next round: the same file, now checked under torch 2.15, published again
    add_check(wheel, str(manifest["sha256"]), CHECK_215)
    again = index.publish([_bundle(wheel, manifest)])
    assert again.added == [] and again.unchanged == [wheel.name]
    assert f"{wheel.name}: its torch checks updated" in again.notes
    served = index.root / "cu130-sm90-torch2.10abi3" / "simple" / "flash-attn" / checks_path(wheel).name
    assert json.loads(served.read_text())["checks"][0]["torch"] == "2.15.0+cu132"
    coverage = json.loads((index.root / COVERAGE_JSON).read_text())
    (row,) = coverage["sections"][0]["rows"]
    assert "checked since its build under torch 2.15.0+cu132" in row["span_label"]
    (entry,) = row["cells"]["*"]
    assert entry["torch_checks"] == [
        {
            "torch": "2.15.0+cu132",
            "python": "3.12",
            "kind": "cpu-import-trace",
            "date": "2026-11-28T11:00:00Z",
        }
    ]
    assert "torch 2.15.0+cu132" in (index.root / "index.html").read_text()
    # nothing new the third time
    assert "nothing new: the index is unchanged" in index.publish([_bundle(wheel, manifest)]).notes


def test_which_torch_215_proposes_the_same_file(tmp_path: Path) -> None:
    wheel, manifest = _wheel(tmp_path)
    index = StaticIndex(tmp_path / "index")
    index.publish([_bundle(wheel, manifest)])
    cpu_only = Env.from_probe(probe(torch="2.14.1+cpu", cuda=None, python="3.12.1"))
    env = with_torch(cpu_only, "2.15", load_compat())
    assert env.accel == "cu132"  # what `pip install torch==2.15` gives on Linux x86_64
    res = resolve(env, str(index.root), "hd128", "flash-attn")
    assert res.choice is not None and res.choice.filename == wheel.name, res.explanation
    # without the compat data the environment's own (CPU) build stays, and nothing fits
    assert resolve(with_torch(cpu_only, "2.15"), str(index.root), "hd128", "flash-attn").choice is None


def test_parity_trace_records_a_failed_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The check runs in the interpreter given: here one whose torch has no flash_attn beside it."""
    pytest.importorskip("torch")
    wheel, manifest = _wheel(tmp_path)
    assert main(["parity", "trace", str(wheel), "--python", sys.executable]) == 6
    assert "cpu-import-trace under torch" in capsys.readouterr().out
    doc = json.loads(checks_path(wheel).read_text())
    (check,) = doc["checks"]
    assert check["passed"] is False and "flash_attn" in check["detail"]["error"]
    assert read_checks(wheel, str(manifest["sha256"])) and not any(c.passed for c in read_checks(wheel))
