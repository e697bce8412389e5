"""Publish's record gates: every wheel's signed build provenance (and SBOM), and for a destination with
`require_parity: true` its signed parity record (docs/records.md).

A record that is present must hold (trusted key, signature, subject sha256, SBOM digest, manifest as
signed): otherwise the whole publish is refused, whatever the flags. A wheel with no provenance at all is
refused unless `--allow-unsigned` (announced loudly); the parity gate reads the signed parity record's
verdict, never the manifest's `parity.passed`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attnforge.core.errors import PublishError, RecordRefused
from attnforge.publish.index import Bundle
from attnforge.wheels.records import (
    PARITY_SUFFIX,
    PROVENANCE_SUFFIX,
    SBOM_SUFFIX,
    TORCH_CHECKS_SUFFIX,
    read_optional,
    record_path,
    verify_build,
    verify_parity,
)
from attnforge.wheels.signing_keys import TrustedKey, describe, short
from attnforge.wheels.torch_checks import read_checks

Log = Callable[[str], None]


def check_build_records(
    bundles: Sequence[Bundle], trusted: Sequence[TrustedKey], allow_unsigned: bool, log: Log, warn: Log
) -> None:
    """Verify each wheel's provenance and SBOM; mark `bundle.signed`; refuse on the first bad record."""
    unsigned: list[Bundle] = []
    problems: list[str] = []
    for b in bundles:
        envelope = read_optional(record_path(b.wheel, PROVENANCE_SUFFIX))
        if envelope is None:
            unsigned.append(b)
            continue
        try:
            checked = verify_build(
                b.filename,
                b.sha256,
                envelope,
                read_optional(record_path(b.wheel, SBOM_SUFFIX)),
                trusted,
                b.manifest,
            )
        except RecordRefused as exc:
            problems.append(str(exc))
            continue
        b.signed = short(checked.provenance.keyid)
        b.records = [record_path(b.wheel, PROVENANCE_SUFFIX), record_path(b.wheel, SBOM_SUFFIX)]
    if problems:
        raise RecordRefused("refused, nothing was published: " + "; ".join(problems))
    if not unsigned:
        return
    names = ", ".join(b.filename for b in unsigned)
    if not allow_unsigned:
        raise RecordRefused(
            f"no signed build provenance for {names}; nothing was published (trusted keys: {describe(trusted)})",
            hint="builds sign their wheels (`attnforge wheels sign WHEEL` signs a finalized one), or --allow-unsigned",
        )
    banner = "!" * 78
    warn(banner)
    warn(f"WARNING: --allow-unsigned: publishing {len(unsigned)} wheel(s) WITHOUT signed provenance: {names}")
    warn(banner)
    for b in unsigned:
        b.signed = "unsigned"


def parity_verdicts(bundles: Sequence[Bundle], trusted: Sequence[TrustedKey]) -> dict[str, str | None]:
    """filename -> None when a signed parity record says the wheel passed, else why it does not count.

    A record that exists but does not verify refuses the publish (PublishError): it is not a missing run."""
    out: dict[str, str | None] = {}
    for b in bundles:
        path = record_path(b.wheel, PARITY_SUFFIX)
        envelope = read_optional(path)
        try:
            verified = verify_parity(b.filename, b.sha256, envelope, trusted, b.manifest)
        except RecordRefused as exc:
            if envelope is not None:
                raise PublishError(f"refused, nothing was published: {exc}") from None
            out[b.filename] = exc.message
            continue
        pred = verified.predicate
        if path not in b.records:
            b.records.append(path)  # served beside the wheel, whatever its verdict
        if pred.get("passed") is True:
            out[b.filename] = None
        else:
            counts = pred.get("counts") or {}
            out[b.filename] = (
                f"{b.filename}: the signed parity run on {pred.get('gpu')} did not pass "
                f"({counts.get('failed', '?')} failed, {counts.get('passed', '?')} passed)"
            )
    return out


def attach_torch_checks(bundles: Sequence[Bundle]) -> None:
    """Serve each wheel's torch checks (`<wheel>.torch-checks.json`) beside it when they are about its bytes."""
    for b in bundles:
        path = record_path(b.wheel, TORCH_CHECKS_SUFFIX)
        if path not in b.records and read_checks(b.wheel, b.sha256):
            b.records.append(path)
