"""Record a parity outcome in a wheel's manifest (``parity: {passed, device, report, date}``) so publishing
can gate on it. Uses attnforge.wheels.manifest's validated read/write when importable, plain JSON otherwise
(the GPU machine's fresh venv may lack pydantic)."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def parity_block(passed: bool, device: str, report: str, date: str | None = None) -> dict[str, Any]:
    """The manifest's ``parity`` value."""
    return {
        "passed": bool(passed),
        "device": device,
        "report": report,
        "date": date or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def record_parity(
    manifest: Path, passed: bool, device: str, report: str, date: str | None = None
) -> dict[str, Any]:
    """Set ``parity`` in ``manifest`` (every other key kept as found); returns the new manifest."""
    block = parity_block(passed, device, report, date)
    try:
        from ..wheels.manifest import read_manifest, write_manifest
    except ImportError:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{manifest}: manifest is not a JSON object") from None
        data["parity"] = block
        _atomic_write(manifest, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        return data
    data = read_manifest(manifest)
    data["parity"] = block
    write_manifest(manifest, data)
    return data


def record_from_report(manifest: Path, report_json: Path, report_ref: str | None = None) -> dict[str, Any]:
    """Record what a parity.json says: passed when it has no failure and at least one passed case."""
    rep = json.loads(report_json.read_text(encoding="utf-8"))
    passed = int(rep.get("failed", 1)) == 0 and int(rep.get("passed", 0)) > 0
    return record_parity(manifest, passed, str(rep.get("device")), report_ref or str(report_json))


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
