"""The signed parity record of a run: a predicate about the tested wheel's sha256 (docs/records.md).

Predicate (`urn:attnforge:parity:v1`): `passed` (the wheel's verdict, `parity_run.wheel_passed`), the
suites with their counts, the totals, the GPU, the driver, torch, the profile tested, and the report
(`parity.json`) with its sha256. The per-case results come from the run's `--save-results` file when
there is one; otherwise the counts come from `parity.json` alone (its cases carry no suite).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from attnforge.builder.files import sha256_file
from attnforge.core.errors import ConfigurationError
from attnforge.engine.env_probe import nvidia_driver
from attnforge.parity.parity_report import FAILED, PASSED, SKIPPED, Report, Result
from attnforge.parity.parity_run import wheel_passed
from attnforge.wheels.manifest import MANIFEST_SUFFIX, read_manifest
from attnforge.wheels.parity_binding import load_report, tested_from_report
from attnforge.wheels.records import write_parity_record
from attnforge.wheels.signing_keys import SiteKey


def _suites(results: list[Result]) -> list[dict[str, Any]]:
    out = []
    for suite in sorted({r.suite for r in results}):
        rs = [r for r in results if r.suite == suite]
        out.append(
            {"name": suite, **{s: sum(1 for r in rs if r.status == s) for s in (PASSED, FAILED, SKIPPED)}}
        )
    return out


def predicate(
    report_json: Path,
    results_json: Path | None,
    report_ref: str | None = None,
    tested_wheel: tuple[str, str] | None = None,
    manifest: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The parity predicate of one run (module docstring); with `tested_wheel` (file name, sha256) the run's
    report must be about that wheel and the predicate binds it (`tested`)."""
    rep = load_report(report_json)
    raw = report_json.read_bytes()
    totals = {k: int(rep.get(k) or 0) for k in (PASSED, FAILED, SKIPPED)}
    suites: list[dict[str, Any]]
    if results_json is not None and results_json.is_file():
        results = _results(results_json)
        report = Report(
            str(rep.get("device")), str(rep.get("torch")), rep.get("wheel"), rep.get("profile"), results
        )
        passed = wheel_passed(report)
        suites = _suites(results)
    else:
        passed = totals[FAILED] == 0 and totals[PASSED] > 0
        kernels = sorted({str(c.get("kernel")) for c in rep.get("cases") or [] if isinstance(c, dict)})
        suites = [{"name": k} for k in kernels]
    driver = nvidia_driver() or {}
    bound = {} if tested_wheel is None else {"tested": tested_from_report(rep, *tested_wheel, manifest)}
    return {
        **bound,
        "passed": passed,
        "suites": suites,
        "counts": totals,
        "gpu": rep.get("device"),
        "driver": driver.get("driver"),
        "driver_cuda": driver.get("cuda"),
        "torch": rep.get("torch"),
        "profile": rep.get("profile"),
        "report": {
            "name": report_ref or str(report_json),
            "digest": {"sha256": hashlib.sha256(raw).hexdigest()},
        },
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def sign_run(
    wheel: Path,
    report_json: Path,
    key: SiteKey,
    results_json: Path | None = None,
    report_ref: str | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Sign the run's predicate about `wheel`'s bytes; (the record's path, the predicate)."""
    if not wheel.is_file():
        raise ConfigurationError(f"{wheel}: no such wheel to sign a parity record about")
    sha256 = sha256_file(wheel)
    manifest_path = wheel.with_name(wheel.name + MANIFEST_SUFFIX)
    manifest = read_manifest(manifest_path) if manifest_path.is_file() else None
    pred = predicate(report_json, results_json, report_ref, (wheel.name, sha256), manifest)
    return write_parity_record(wheel, sha256, pred, key), pred


def _results(path: Path) -> list[Result]:
    """The run's per-case results file, checked; ConfigurationError naming it otherwise."""
    try:
        data = json.loads(path.read_bytes()[: 256 * 1024 * 1024])
        return [Result(**d) for d in data]
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        raise ConfigurationError(f"{path}: not a parity results file ({str(exc)[:80]})") from None
