"""The signed records beside a wheel, written and checked (docs/records.md).

    <wheel>.provenance.intoto.json   DSSE envelope: SLSA provenance of the build (written after finalize)
    <wheel>.cdx.json                 CycloneDX SBOM (its sha256 is in the provenance)
    <wheel>.parity.intoto.json       DSSE envelope: the GPU parity run's verdict (written by `parity run`)

`verify_build` and `verify_parity` take the bytes (from files or from an index over HTTP), the wheel's name
and sha256, and the trusted keys; they raise RecordRefused with the reason.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnforge.builder.files import atomic_write_bytes
from attnforge.core.errors import RecordRefused
from attnforge.wheels import provenance
from attnforge.wheels.parity_binding import mismatches
from attnforge.wheels.signing_keys import SiteKey, TrustedKey
from attnforge.wheels.statements import Verified, dumps, sign, statement, verify

PROVENANCE_SUFFIX = ".provenance.intoto.json"
SBOM_SUFFIX = ".cdx.json"
PARITY_SUFFIX = ".parity.intoto.json"
TORCH_CHECKS_SUFFIX = (
    ".torch-checks.json"  # wheels/torch_checks.py: other torch releases it was checked under
)
RECORD_SUFFIXES = (PROVENANCE_SUFFIX, SBOM_SUFFIX, PARITY_SUFFIX, TORCH_CHECKS_SUFFIX)
PARITY_PREDICATE = "urn:attnforge:parity:v1"

Log = Callable[[str], None]


def record_path(wheel: Path, suffix: str) -> Path:
    """`dist/x.whl` -> `dist/x.whl<suffix>`."""
    return wheel.with_name(wheel.name + suffix)


def existing_records(wheel: Path) -> list[Path]:
    """The record files present beside `wheel`."""
    return [p for p in (record_path(wheel, s) for s in RECORD_SUFFIXES) if p.is_file()]


def write_build_records(wheel: Path, manifest: dict[str, Any], key: SiteKey) -> list[Path]:
    """Write the SBOM and the signed provenance of a finalized wheel beside it; a parity record about other
    bytes (an earlier wheel of the same name) is removed."""
    from attnforge.wheels.sbom import make_sbom  # start-up cost: cyclonedx only where an SBOM is written

    sbom = make_sbom(wheel, manifest)
    sbom_path = record_path(wheel, SBOM_SUFFIX)
    atomic_write_bytes(sbom_path, sbom)
    pred = provenance.predicate(manifest, sbom_path.name, hashlib.sha256(sbom).hexdigest())
    stmt = statement(wheel.name, str(manifest["sha256"]), provenance.PREDICATE_TYPE, pred)
    prov_path = record_path(wheel, PROVENANCE_SUFFIX)
    atomic_write_bytes(prov_path, dumps(sign(stmt, key)))
    parity = record_path(wheel, PARITY_SUFFIX)
    if parity.is_file() and _subject_sha256(parity.read_bytes()) != manifest["sha256"]:
        parity.unlink()  # a parity run of earlier bytes under the same name
    return [prov_path, sbom_path]


def _subject_sha256(envelope: bytes) -> str | None:
    """The sha256 an envelope's statement names (unverified: only to tell whose record it is)."""
    try:
        stmt = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
        return str(stmt["subject"][0]["digest"]["sha256"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def write_parity_record(wheel: Path, sha256: str, predicate: dict[str, Any], key: SiteKey) -> Path:
    """Sign a parity predicate about `wheel` (its sha256) and write it beside the wheel."""
    stmt = statement(wheel.name, sha256, PARITY_PREDICATE, predicate)
    path = record_path(wheel, PARITY_SUFFIX)
    atomic_write_bytes(path, dumps(sign(stmt, key)))
    return path


@dataclass(frozen=True)
class BuildCheck:
    """A build record that held: the verified provenance and the SBOM's digest."""

    provenance: Verified
    sbom_sha256: str


def verify_build(
    wheel_name: str,
    sha256: str,
    envelope: bytes | None,
    sbom: bytes | None,
    trusted: Sequence[TrustedKey],
    manifest: dict[str, Any] | None = None,
) -> BuildCheck:
    """The provenance is signed by a trusted key, about these bytes, names the SBOM's digest, and (when a
    manifest is given) signs what the manifest says."""
    what = f"{wheel_name}{PROVENANCE_SUFFIX}"
    if envelope is None:
        raise RecordRefused(f"{wheel_name}: no signed build provenance ({what})")
    verified = verify(
        envelope,
        trusted,
        what=what,
        subject_name=wheel_name,
        sha256=sha256,
        predicate_type=provenance.PREDICATE_TYPE,
    )
    sbom_name = wheel_name + SBOM_SUFFIX
    want = provenance.sbom_digest(verified.predicate, sbom_name)
    if sbom is None:
        raise RecordRefused(f"{wheel_name}: no SBOM ({sbom_name})")
    have = hashlib.sha256(sbom).hexdigest()
    if want != have:
        raise RecordRefused(
            f"{sbom_name}: sha256 {have[:16]}..., the signed provenance names {str(want)[:16]}..."
        )
    if manifest is not None:
        drift = provenance.manifest_drift(manifest, verified.predicate)
        if drift:
            raise RecordRefused(
                f"{wheel_name}: its manifest differs from the signed provenance: "
                + "; ".join(drift[:6])
                + (f" (and {len(drift) - 6} more)" if len(drift) > 6 else ""),
                hint="the manifest was edited after the build signed it",
            )
    return BuildCheck(verified, have)


def verify_parity(
    wheel_name: str,
    sha256: str,
    envelope: bytes | None,
    trusted: Sequence[TrustedKey],
    manifest: dict[str, Any] | None = None,
) -> Verified:
    """The parity record is signed by a trusted key, about these bytes, and what it says was tested (wheel,
    sha256, Python, torch, profile, GPU) is this wheel (`parity_binding`); its verdict is the caller's."""
    what = f"{wheel_name}{PARITY_SUFFIX}"
    if envelope is None:
        raise RecordRefused(
            f"{wheel_name}: no signed parity record ({what}); a manifest's parity.passed is not evidence",
            hint="run `attnforge parity run --wheel WHEEL` on a GPU: it signs the outcome",
        )
    verified = verify(
        envelope, trusted, what=what, subject_name=wheel_name, sha256=sha256, predicate_type=PARITY_PREDICATE
    )
    wrong = mismatches(verified.predicate.get("tested"), wheel_name, sha256, manifest)
    if wrong:
        raise RecordRefused(
            f"{what}: the signed run did not test this wheel: " + "; ".join(wrong[:3]),
            hint="run `attnforge parity run --wheel WHEEL` on a GPU for this wheel",
        )
    return verified


def read_optional(path: Path) -> bytes | None:
    """A record's bytes, or None when the file is absent."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
