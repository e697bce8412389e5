"""in-toto statements about a wheel's sha256, signed into DSSE envelopes (securesystemslib), and checked.

A statement (in-toto Statement v1) names its subject (the wheel's file name and sha256), a predicate type
and the predicate; its JSON is the payload of a DSSE envelope (`payloadType: application/vnd.in-toto+json`)
signed with the site key. `verify` refuses, with the reason, an envelope that is not one, a signature by
no trusted key or one that does not verify, a statement of another type, and one about other bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError

from attnforge.core.errors import RecordRefused
from attnforge.wheels.signing_keys import SiteKey, TrustedKey, describe, short

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"


def statement(
    subject_name: str, sha256: str, predicate_type: str, predicate: dict[str, Any]
) -> dict[str, Any]:
    """An in-toto Statement v1 about one file."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": sha256}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def sign(stmt: dict[str, Any], key: SiteKey) -> dict[str, Any]:
    """The DSSE envelope (as JSON-ready dict) of `stmt`, signed with `key`."""
    payload = json.dumps(stmt, sort_keys=True, separators=(",", ":")).encode("utf-8")
    envelope = Envelope(payload, PAYLOAD_TYPE, {})
    envelope.sign(key.signer)
    return dict(envelope.to_dict())


def dumps(envelope: dict[str, Any]) -> bytes:
    """The on-disk form of an envelope."""
    return (json.dumps(envelope, indent=2, sort_keys=True) + "\n").encode("utf-8")


@dataclass(frozen=True)
class Verified:
    """A statement whose signature, type and subject held."""

    statement: dict[str, Any]
    keyid: str
    key_origin: str

    @property
    def predicate(self) -> dict[str, Any]:
        return dict(self.statement.get("predicate") or {})


def _envelope(raw: bytes | dict[str, Any], what: str) -> Envelope:
    try:
        data = json.loads(raw) if isinstance(raw, bytes) else json.loads(json.dumps(raw))
        return Envelope.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RecordRefused(f"{what}: not a DSSE envelope ({type(exc).__name__}: {exc})") from None


def verify(
    raw: bytes | dict[str, Any],
    trusted: Sequence[TrustedKey],
    *,
    what: str,
    subject_name: str,
    sha256: str,
    predicate_type: str,
) -> Verified:
    """Check an envelope (module docstring); RecordRefused naming `what` and the reason."""
    envelope = _envelope(raw, what)
    if envelope.payload_type != PAYLOAD_TYPE:
        raise RecordRefused(f"{what}: payloadType {envelope.payload_type!r}, not {PAYLOAD_TYPE!r}")
    by_id = {k.keyid: k for k in trusted}
    signed_by = sorted(envelope.signatures)
    known = [k for k in signed_by if k in by_id]
    if not known:
        names = ", ".join(short(k) for k in signed_by) or "no key"
        trusted_here = f"trusted: {describe(trusted)}" if trusted else "no trusted key is configured"
        raise RecordRefused(
            f"{what}: signed by {names}, not a trusted key ({trusted_here})",
            hint=(
                "give the signer's public key (`attnforge keys show` on the signing machine names its file) "
                "with --trusted-key FILE, or list it in matrix.yaml signing.trusted_keys or $ATTNFORGE_TRUSTED_KEYS"
            ),
        )
    try:
        accepted = envelope.verify([by_id[k].key for k in known], 1)
    except VerificationError:
        raise RecordRefused(
            f"{what}: the signature by {', '.join(short(k) for k in known)} does not verify: the statement "
            "or its signature was altered"
        ) from None
    keyid = next(iter(accepted))
    try:
        stmt = json.loads(envelope.payload)
    except ValueError:
        raise RecordRefused(f"{what}: the signed payload is not JSON") from None
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        raise RecordRefused(f"{what}: not an in-toto Statement v1")
    if stmt.get("predicateType") != predicate_type:
        raise RecordRefused(
            f"{what}: predicateType {stmt.get('predicateType')!r}, expected {predicate_type!r}"
        )
    subjects = [s for s in stmt.get("subject") or [] if isinstance(s, dict)]
    digests = [str((s.get("digest") or {}).get("sha256")) for s in subjects]
    if sha256 not in digests:
        about = (
            ", ".join(f"{s.get('name')} sha256 {d[:16]}..." for s, d in zip(subjects, digests, strict=True))
            or "nothing"
        )
        raise RecordRefused(
            f"{what}: the signed statement is about {about}; the wheel {subject_name} is sha256 {sha256[:16]}...",
            hint="the wheel's bytes changed after it was signed",
        )
    named = [s.get("name") for s in subjects if (s.get("digest") or {}).get("sha256") == sha256]
    if subject_name not in named:
        raise RecordRefused(f"{what}: the signed statement names {named[0]!r}, not {subject_name!r}")
    return Verified(stmt, keyid, by_id[keyid].origin)
