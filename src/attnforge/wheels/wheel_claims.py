"""What a wheel says about itself (file name and METADATA), checked against its manifest.

The wheel is the thing pip installs, so its own names decide: the variant and local version come from
the version's local segment (`parse_local`), the tags from the file name, the torch requirement from
METADATA's `Requires-Dist`. The manifest's claims are recomputed by the planner's code (`expected_names`:
the Cell of its inputs) and must agree on each; `check` refuses a mismatch naming both values.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import compat32
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion

from attnforge.core.errors import AttnforgeError, PublishError
from attnforge.wheels.naming import TORCH_PROJECT, expected_names, parse_local
from attnforge.wheels.zip_limits import check_directory, read_member


@dataclass(frozen=True)
class WheelClaims:
    """The wheel's own names."""

    project: str
    version: str  # as the file name spells it
    local_version: str
    variant: str | None  # None: the local version names no attnforge variant
    python_tag: str
    abi_tag: str
    platforms: tuple[str, ...]
    metadata_version: str
    torch_requirements: tuple[str, ...]


def _metadata(wheel: Path, project: str, version: str) -> bytes:
    want = f"{canonicalize_name(project).replace('-', '_')}-{version}.dist-info/METADATA".lower()
    try:
        with zipfile.ZipFile(wheel) as zf:
            check_directory(wheel, zf)
            found = [n for n in zf.namelist() if n.lower() == want]
            if not found:
                raise PublishError(f"{wheel.name}: no {want} inside the wheel")
            return read_member(wheel, zf, found[0])
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise PublishError(f"{wheel.name}: not a readable wheel: {exc}") from None


def read_claims(wheel: Path) -> WheelClaims:
    """Parse the wheel's file name and METADATA."""
    try:
        name, _, _, tags = parse_wheel_filename(wheel.name)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise PublishError(f"{wheel.name}: {exc}") from None
    spelled = wheel.name.split("-")[1]
    local = spelled.partition("+")[2]
    parts = parse_local(local) if local else None
    meta = BytesParser(policy=compat32).parsebytes(_metadata(wheel, str(name), spelled))
    pins = []
    for line in meta.get_all("Requires-Dist") or []:
        try:
            req = Requirement(str(line))
        except InvalidRequirement:
            raise PublishError(f"{wheel.name}: METADATA has an invalid Requires-Dist {line!r}") from None
        if canonicalize_name(req.name) == TORCH_PROJECT and req.marker is None:
            pins.append(str(req))
    tag_list = sorted(tags, key=str)
    return WheelClaims(
        project=str(name),
        version=spelled,
        local_version=local,
        variant=parts.variant if parts else None,
        python_tag=".".join(sorted({t.interpreter for t in tag_list})),
        abi_tag=".".join(sorted({t.abi for t in tag_list})),
        platforms=tuple(sorted({t.platform for t in tag_list})),
        metadata_version=str(meta.get("Version") or ""),
        torch_requirements=tuple(pins),
    )


def mismatches(claims: WheelClaims, manifest: dict[str, Any]) -> list[str]:
    """Every way the manifest's claims differ from the wheel's own (empty when they agree)."""
    try:
        names = expected_names(manifest, claims.local_version or None)
    except AttnforgeError as exc:
        return [f"the manifest's inputs name no wheel: {exc}"]
    out: list[str] = []

    def differ(what: str, wheel_says: object, manifest_says: object) -> None:
        out.append(f"{what}: the wheel says {wheel_says}, the manifest says {manifest_says}")

    if claims.variant is None:
        differ(
            "variant", f"none (local version {claims.local_version or 'missing'!r})", manifest.get("variant")
        )
    else:
        if claims.variant != manifest.get("variant"):
            differ("variant", claims.variant, manifest.get("variant"))
        elif claims.variant != names.variant:
            differ("variant", claims.variant, f"{names.variant} (from its inputs)")
    if claims.local_version.lower() != names.local_version.lower():
        differ("local version", claims.local_version, f"{names.local_version} (from its inputs)")
    elif str(manifest.get("local_version") or claims.local_version).lower() != claims.local_version.lower():
        differ("local version", claims.local_version, manifest.get("local_version"))
    if claims.metadata_version.lower() != claims.version.lower():
        differ("METADATA Version", claims.metadata_version, f"{claims.version} (the file name)")
    if canonicalize_name(claims.project) != canonicalize_name(names.dist):
        differ("project", claims.project, names.dist)
    want_abi = "none" if names.pure_python else names.abi_tag or names.python_tag
    want_py = "py3" if names.pure_python else names.python_tag
    if (claims.python_tag, claims.abi_tag) != (want_py, want_abi):
        differ("tags", f"{claims.python_tag}-{claims.abi_tag}", f"{want_py}-{want_abi} (from its inputs)")
    plat = "any" if names.pure_python else names.platform
    if not all(p == plat or p.endswith("_" + plat) for p in claims.platforms):
        differ("platform", ".".join(claims.platforms), plat)
    signed_tag = (manifest.get("platform_tag") or {}).get("tag")
    if signed_tag and signed_tag != ".".join(claims.platforms):
        differ("platform tag", ".".join(claims.platforms), signed_tag)
    if claims.torch_requirements != (names.torch_requirement,):
        pins = ", ".join(claims.torch_requirements) or "no torch requirement"
        differ("torch requirement", pins, f"{names.torch_requirement} (from its inputs)")
    recorded = (manifest.get("finalize") or {}).get("torch_requirement")
    if recorded and recorded != names.torch_requirement:
        differ("torch requirement", ", ".join(claims.torch_requirements), recorded)
    return out


def check(wheel: Path, manifest: dict[str, Any]) -> WheelClaims:
    """Refuse (PublishError, exit 7) a wheel whose own names disagree with its manifest; its claims."""
    claims = read_claims(wheel)
    problems = mismatches(claims, manifest)
    if problems:
        raise PublishError(
            f"{wheel.name}: the wheel and its manifest disagree: " + "; ".join(problems),
            hint="publish trusts the wheel: finalize it again from the right manifest",
        )
    return claims
