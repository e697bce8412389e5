"""Parity outcomes land in the wheel's manifest (`parity: {passed, device, report, date}`), other keys kept."""

from __future__ import annotations

import json
from pathlib import Path

from attnforge.wheels.manifest import record_from_report, record_parity

MANIFEST = {
    "schema": 1,
    "cell_id": "c",
    "variant": "cu130-torch2.11",
    "kernel": "flash-attn",
    "kernel_version": "2.8.3",
    "wheel": "flash_attn-2.8.3+x-cp312-cp312-linux_x86_64.whl",
    "sha256": "ab",
    "size": 1,
    "inputs": {
        "toolkit": "cuda13.0",
        "torch": "2.11.0",
        "python": "3.12",
        "cxx11_abi": True,
        "profile": "hd128",
        "head_dims": [128],
    },
    "build": {"wall_s": 1.0},
    "parity": None,
}


def test_record_parity_keeps_everything_else(tmp_path: Path) -> None:
    m = tmp_path / "w.whl.manifest.json"
    m.write_text(json.dumps(MANIFEST))
    record_parity(m, True, "NVIDIA H100 80GB HBM3", "reports/gpu/parity.json", "2026-11-23T00:00:00+00:00")
    data = json.loads(m.read_text())
    assert data["parity"] == {
        "passed": True,
        "device": "NVIDIA H100 80GB HBM3",
        "report": "reports/gpu/parity.json",
        "date": "2026-11-23T00:00:00+00:00",
    }
    assert {k: v for k, v in data.items() if k != "parity"} == {
        k: v for k, v in MANIFEST.items() if k != "parity"
    }
    # the GPU driver's version, when the run knows it (the index page shows it with the device)
    record_parity(
        m, True, "NVIDIA H100 80GB HBM3", "parity.json", "2026-11-23T00:00:00+00:00", driver="580.65.06"
    )
    assert json.loads(m.read_text())["parity"]["driver"] == "580.65.06"


def test_record_from_report(tmp_path: Path) -> None:
    m = tmp_path / "w.whl.manifest.json"
    m.write_text(json.dumps(MANIFEST))
    rep = tmp_path / "parity.json"
    rep.write_text(json.dumps({"device": "H100", "passed": 10, "failed": 1, "skipped": 0, "cases": []}))
    assert record_from_report(m, rep)["parity"]["passed"] is False
    rep.write_text(json.dumps({"device": "H100", "passed": 10, "failed": 0, "skipped": 3, "cases": []}))
    assert record_from_report(m, rep, "reports/gpu/parity.json")["parity"]["passed"] is True
