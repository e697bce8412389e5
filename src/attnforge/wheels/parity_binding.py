"""What a parity run tested, bound to one wheel: read from an untrusted report, checked at every gate.

A parity report (`parity.json`) is read with a size cap and its shape checked (counts are non-negative
integers, names are strings). The signed parity predicate carries `tested`: the wheel's file name and sha256,
the Python tag, torch, the profile and the GPU the run used. Signing refuses a report made for another
wheel, and every gate (publish, `which --verify`, `doctor --verify`) refuses a signed record whose `tested`
does not describe the wheel in hand, naming the field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from attnforge.core.errors import ConfigurationError
from attnforge.wheels.naming import parse_local, torch_family

REPORT_MAX_BYTES = 64 * 1024 * 1024  # a parity.json of every case of every suite is well under 10 MB
FIELDS = ("wheel", "sha256", "python", "torch", "profile", "gpu")
_COUNTS = ("passed", "failed", "skipped")
_STRINGS = ("device", "torch", "wheel", "profile", "python", "wheel_sha256")
_PY_TAG = re.compile(r"^(?:cp|py)3\d{0,2}$")


def load_report(path: Path) -> dict[str, Any]:
    """A parity report as a checked dict; ConfigurationError naming the file and the field otherwise."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(REPORT_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigurationError(f"{path}: not a readable parity report: {exc.strerror or exc}") from None
    if len(raw) > REPORT_MAX_BYTES:
        raise ConfigurationError(f"{path}: parity report over {REPORT_MAX_BYTES // 2**20} MiB")
    try:
        rep = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ConfigurationError(f"{path}: not a parity report (not JSON: {str(exc)[:80]})") from None
    if not isinstance(rep, dict):
        raise ConfigurationError(f"{path}: not a parity report (a JSON {type(rep).__name__}, not an object)")
    for key in _COUNTS:
        value = rep.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**9:
            raise ConfigurationError(f"{path}: `{key}` must be a count (0 or more), not {str(value)[:40]!r}")
    for key in _STRINGS:
        value = rep.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > 1000):
            raise ConfigurationError(f"{path}: `{key}` must be a short string, not {str(value)[:40]!r}")
    if not isinstance(rep.get("cases", []), list):
        raise ConfigurationError(f"{path}: `cases` must be a list")
    return rep


def profile_name(described: str) -> str:
    """`fwd128: head dims [128], ...` or `flash-attn-3 hd64128: ...` -> the profile's name."""
    head = described.split(":", 1)[0].strip()
    return head.split()[-1] if head else head


def tested_from_report(
    rep: dict[str, Any], wheel_name: str, sha256: str, manifest: dict[str, Any] | None
) -> dict[str, str]:
    """The `tested` block a signed predicate carries, from a checked report about the wheel `wheel_name`
    with bytes `sha256`; ConfigurationError naming the first field the report does not bind."""
    by_bytes = rep.get("wheel_sha256") == sha256  # a run that recorded the bytes it tested names them
    tested = {
        "wheel": rep.get("wheel") or (wheel_name if by_bytes else ""),
        "sha256": rep.get("wheel_sha256") or sha256,
        "python": rep.get("python") or "",
        "torch": rep.get("torch") or "",
        "profile": profile_name(rep.get("profile") or ""),
        "gpu": rep.get("device") or "",
    }
    problems = mismatches(tested, wheel_name, sha256, manifest)
    if problems:
        raise ConfigurationError(
            f"the parity report was not made for {wheel_name}: {problems[0]}",
            hint="sign the report of a run of this wheel (`attnforge parity run --wheel WHEEL`)",
        )
    return tested


def _python_fits(python: str, tags: frozenset[Tag]) -> bool:
    """Whether an interpreter tag (cp311) runs a wheel with these tags (cp311, py3, abi3 from cp39)."""
    for tag in tags:
        if tag.interpreter == python or (tag.interpreter.startswith("py") and python.startswith("cp3")):
            return True
        abi3 = tag.abi == "abi3" and tag.interpreter.startswith("cp3") and python.startswith("cp3")
        if abi3 and int(python[3:] or 0) >= int(tag.interpreter[3:] or 0):
            return True
    return False


def mismatches(tested: Any, wheel_name: str, sha256: str, manifest: dict[str, Any] | None) -> list[str]:
    """Each field of `tested` that does not describe this wheel, as `field: tested X, the wheel is Y`."""
    if not isinstance(tested, dict):
        return ["tested: the record binds no tested subject (wheel, sha256, python, torch, profile, gpu)"]
    missing = [f for f in FIELDS if not isinstance(tested.get(f), str) or not tested.get(f)]
    if missing:
        return [f"{f}: not recorded" for f in missing]
    out: list[str] = []
    if tested["wheel"] != wheel_name:
        out.append(f"wheel: tested {tested['wheel'][:120]}, the wheel is {wheel_name}")
    if tested["sha256"] != sha256:
        out.append(f"sha256: tested {tested['sha256'][:16]}..., the wheel's is {sha256[:16]}...")
    try:
        _, version, _, tags = parse_wheel_filename(wheel_name)
    except InvalidWheelFilename:
        return out
    python = tested["python"]
    if not _PY_TAG.match(python) or not _python_fits(python, tags):
        out.append(
            f"python: tested {python[:20]}, the wheel is {'.'.join(sorted({t.interpreter for t in tags}))}"
        )
    parts = parse_local(version.local or "")
    inputs = (manifest or {}).get("inputs") or {}
    if parts is not None:
        problem = parts.torch_problem(tested["torch"])
        accel = tested["torch"].partition("+")[2]
        if problem is None and accel and (accel.startswith(("cu", "rocm"))):
            problem = parts.accel_problem(accel)
        if problem:
            out.append(f"torch: tested {tested['torch'][:40]}, {problem}")
    elif isinstance(inputs.get("torch"), str) and torch_family(inputs["torch"]) != torch_family(
        tested["torch"]
    ):
        out.append(f"torch: tested {tested['torch'][:40]}, the wheel was built for {inputs['torch']}")
    want_profile = inputs.get("profile")
    if isinstance(want_profile, str) and tested["profile"] != want_profile:
        out.append(f"profile: tested {tested['profile'][:40]}, the wheel's is {want_profile}")
    return out
