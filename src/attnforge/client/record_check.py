"""`which --verify` and `doctor --verify`: an offered or installed wheel checked against its signed records.

Offered: the index serves `<wheel>.provenance.intoto.json`, `.cdx.json` and `.parity.intoto.json` beside
the wheel (a static index), or a records folder holds them as `<records_url>/<project>/<wheel><suffix>` (an
index server such as pypiserver keeps packages only: `--records-url`); the provenance must be signed by a trusted key and be about the sha256 the index lists for the
file (the hash pip checks when it downloads it), the SBOM must have the digest the provenance names, the
served manifest must say what was signed, and a parity record, when there is one, must verify too.
Installed: the installed distribution (name, version, WHEEL tags) is found in the index, checked as
offered, downloaded, and every file of its RECORD must be installed with the same sha256.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from attnforge.client.index_fetch import IndexFault, IndexReader
from attnforge.client.records_location import records_base
from attnforge.client.which import fetch_project
from attnforge.core.errors import EnvironmentProblem, RecordRefused
from attnforge.wheels.records import (
    PARITY_SUFFIX,
    PROVENANCE_SUFFIX,
    SBOM_SUFFIX,
    verify_build,
    verify_parity,
)
from attnforge.wheels.signing_keys import TrustedKey, short

WHEEL_BUDGET_S = 600.0  # downloading the installed wheel again (each read still within the connect timeout)
MAX_WHEEL_BYTES = 4 * 1024**3


@dataclass
class RecordLine:
    """One line of a verification report (the same shape as doctor's checks)."""

    name: str
    status: str  # ok | fail | warn
    detail: str


@dataclass(frozen=True)
class Offered:
    """A wheel file as an index lists it."""

    filename: str
    url: str
    sha256: str


def _fetch(reader: IndexReader, url: str, max_bytes: int | None = None) -> bytes | None:
    """The body at `url` read within `reader`'s budget, None when it is not there; EnvironmentProblem naming
    the URL and what went wrong otherwise (refused, timeout, HTTP status)."""
    try:
        body, _ = reader.get(url, max_bytes=max_bytes) if max_bytes else reader.get(url)
    except IndexFault as fault:
        if fault.kind == "not-found":
            return None
        raise EnvironmentProblem(f"cannot read the index: {fault}") from None
    return body


def offered(index_url: str, project: str, pick: Any, reader: IndexReader | None = None) -> Offered:
    """The first file of the index's project page for which `pick(filename)` is true (the page read as
    `which` reads it: within `reader`'s budget, failures named with their URL)."""
    page, data = fetch_project(index_url, project, reader or IndexReader())
    for f in data.get("files") or []:
        if not isinstance(f, dict):
            continue
        name = f.get("filename")
        if isinstance(name, str) and name.endswith(".whl") and pick(name):
            sha = str((f.get("hashes") or {}).get("sha256") or "")
            if not sha:
                raise RecordRefused(f"{name}: the index lists no sha256 for it")
            return Offered(name, urljoin(page, str(f.get("url") or name)), sha)
    raise RecordRefused(f"no matching {project} wheel in {index_url}")


def verify_offered(
    wheel: Offered,
    trusted: Sequence[TrustedKey],
    reader: IndexReader | None = None,
    records_url: str | None = None,
) -> list[RecordLine]:
    """Check the records the index serves beside `wheel`, or `records_url` holds for it (module docstring),
    read within `reader`'s budget; RecordRefused on a bad one."""
    reader = reader or IndexReader()
    base = records_base(wheel.url, wheel.filename, records_url)
    manifest_raw = _fetch(reader, base + ".manifest.json")
    manifest = json.loads(manifest_raw) if manifest_raw else None
    provenance = _fetch(reader, base + PROVENANCE_SUFFIX)
    if provenance is None and not records_url:
        raise RecordRefused(
            f"{wheel.filename}: no signed build provenance beside the wheel ({base}{PROVENANCE_SUFFIX}); an "
            "index server such as pypiserver keeps packages only: pass --records-url, the URL its publish "
            "destination's `records` folder is served at"
        )
    build = verify_build(
        wheel.filename,
        wheel.sha256,
        provenance,
        _fetch(reader, base + SBOM_SUFFIX),
        trusted,
        manifest,
    )
    lines = [
        RecordLine(
            "provenance",
            "ok",
            f"signed by {short(build.provenance.keyid)} ({build.provenance.key_origin}) about sha256 "
            f"{wheel.sha256[:16]}..., the hash the index lists for {wheel.filename}",
        ),
        RecordLine(
            "sbom", "ok", f"{wheel.filename}{SBOM_SUFFIX}: sha256 {build.sbom_sha256[:16]}... as signed"
        ),
    ]
    if manifest is not None:
        lines.append(RecordLine("manifest", "ok", "says what the provenance signed"))
    parity_raw = _fetch(reader, base + PARITY_SUFFIX)
    if parity_raw is None:
        lines.append(RecordLine("parity", "warn", "no signed parity record beside the wheel"))
    else:
        pred = verify_parity(wheel.filename, wheel.sha256, parity_raw, trusted, manifest).predicate
        counts = pred.get("counts") or {}
        status = "ok" if pred.get("passed") is True else "fail"
        lines.append(
            RecordLine(
                "parity",
                status,
                f"signed run on {pred.get('gpu')}"
                + (f" (driver {pred['driver']})" if pred.get("driver") else "")
                + ": "
                f"{'passed' if status == 'ok' else 'FAILED'}, {counts.get('passed', '?')} passed, "
                f"{counts.get('failed', '?')} failed",
            )
        )
    return lines


_INSTALLED_PROBE = """
import importlib.metadata as m, json, sys
d = m.distribution(sys.argv[1])
wheel = d.read_text("WHEEL") or ""
print(json.dumps({"name": d.metadata["Name"], "version": d.version, "root": str(d.locate_file("")),
  "tags": sorted(l.split(":", 1)[1].strip() for l in wheel.splitlines() if l.startswith("Tag:"))}))
"""


def installed(python: str | None, project: str) -> dict[str, Any]:
    """Name, version, WHEEL tags and site folder of `project` installed for `python`."""
    exe = python or sys.executable
    proc = subprocess.run(
        [exe, "-c", _INSTALLED_PROBE, project], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"{project} is not installed for {exe}: {tail}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _same_wheel(dist: dict[str, Any]) -> Any:
    def pick(filename: str) -> bool:
        try:
            name, version, _, tags = parse_wheel_filename(filename)
            same_version = version == Version(str(dist["version"]))
        except (InvalidWheelFilename, InvalidVersion):
            return False
        return (
            canonicalize_name(name) == canonicalize_name(str(dist["name"]))
            and same_version
            and sorted(str(t) for t in tags) == sorted(dist["tags"])
        )

    return pick


def _record_rows(wheel_bytes: bytes) -> list[tuple[str, str]]:
    """(path, sha256 hex) of every file the wheel's RECORD lists with a hash."""
    with zipfile.ZipFile(io.BytesIO(wheel_bytes)) as zf:
        record = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(record).decode("utf-8"))))
    out = []
    for row in rows:
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = base64.urlsafe_b64decode(row[1].removeprefix("sha256=") + "==").hex()
            out.append((row[0], digest))
    return out


def verify_installed(
    python: str | None,
    index_url: str,
    project: str,
    trusted: Sequence[TrustedKey],
    records_url: str | None = None,
) -> list[RecordLine]:
    """The installed wheel is one the index offers with good records (beside it, or under `records_url`),
    file for file (module docstring)."""
    dist = installed(python, project)
    reader = IndexReader()
    wheel = offered(index_url, project, _same_wheel(dist), reader)
    lines = verify_offered(wheel, trusted, reader, records_url)
    body = _fetch(IndexReader(total_s=WHEEL_BUDGET_S, shared=False), wheel.url, MAX_WHEEL_BYTES)
    if body is None:
        raise RecordRefused(f"{wheel.url}: not found")
    digest = hashlib.sha256(body).hexdigest()
    if digest != wheel.sha256:
        raise RecordRefused(
            f"{wheel.filename}: the index serves sha256 {digest[:16]}..., it lists (and the records sign) "
            f"{wheel.sha256[:16]}..."
        )
    root = Path(str(dist["root"]))
    bad: list[str] = []
    rows = _record_rows(body)
    for rel, sha in rows:
        path = root / rel
        try:
            have = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            bad.append(f"{rel} missing")
            continue
        if have != sha:
            bad.append(f"{rel} differs (sha256 {have[:12]}..., signed wheel {sha[:12]}...)")
    if bad:
        lines.append(
            RecordLine(
                "installed files",
                "fail",
                f"{len(bad)} of {len(rows)} differ from the signed wheel: " + "; ".join(bad[:5]),
            )
        )
    else:
        lines.append(
            RecordLine(
                "installed files",
                "ok",
                f"all {len(rows)} files of {wheel.filename} installed with the signed wheel's sha256",
            )
        )
    return lines
