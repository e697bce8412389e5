"""Ahead-of-time compiled FlashAttention-4 kernels, found by FA4 itself.

In the ``attnforge-fa4-kernels`` wheel this package is ``attnforge_fa4``; in attnforge's sources it is
``attnforge.fa4.runtime``. Its ``artifacts/`` folder holds FA4 persistent-cache entries (``<kind>/<key
hash>.o``) and ``manifest.json`` (the fingerprint they were filed under, the versions it stands for, the GPU
arch, the declarations). The wheel's ``attnforge_fa4.pth`` turns FA4's persistent cache on and, when FA4's
``cache_utils`` is imported, copies the entries into FA4's cache folder (``seed``) if the fingerprint of the
installed FA4 equals the manifest's. Otherwise it warns once (``FA4CacheWarning``, naming what differs) and
FA4 compiles at the first call as it would without this package. Importing this package never imports FA4,
torch or CUDA, and never raises.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fingerprint import fingerprint, sources_digest

__all__ = [
    "ARTIFACTS",
    "MANIFEST",
    "Check",
    "FA4CacheWarning",
    "check",
    "fingerprint",
    "read_manifest",
    "seed",
    "sources_digest",
    "stats",
]

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
MANIFEST = "manifest.json"
ENTRIES = "cache"  # ARTIFACTS/cache/<kind>/<hash>.o
_WARNED: set[str] = set()
_STATS: dict[str, Any] = {"fingerprint": None, "seeded": 0, "present": 0, "warnings": []}


class FA4CacheWarning(UserWarning):
    """The precompiled FA4 kernels do not fit this environment; FA4 compiles as usual."""


def warn_once(key: str, message: str) -> None:
    """Warn with ``FA4CacheWarning`` the first time ``key`` is seen in this process."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    _STATS["warnings"].append(message)
    warnings.warn(message, FA4CacheWarning, stacklevel=3)


def read_manifest(artifacts: Path = ARTIFACTS) -> dict[str, Any]:
    """The artifacts' manifest (``{}`` when missing or unreadable)."""
    try:
        data = json.loads((artifacts / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class Check:
    """Whether the artifacts fit: ``ok``, else ``reasons`` (one line each: what was built vs what is here)."""

    ok: bool
    fingerprint: str
    reasons: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        """The reasons joined, or ``fits``."""
        return "; ".join(self.reasons) if self.reasons else "fits"


def check(
    manifest: dict[str, Any],
    cute_root: Path,
    python: str,
    cutlass: str,
    tvm_ffi: str,
    actual: str | None = None,
) -> Check:
    """Compare the manifest's fingerprint with the installed FA4's (``actual`` when FA4 computed it already).

    On a mismatch each differing input is named: Python, cutlass-dsl, tvm-ffi, FA4's sources."""
    fp = actual or fingerprint(cute_root, python, cutlass, tvm_ffi)
    want = str(manifest.get("fingerprint", ""))
    if not want:
        return Check(False, fp, ["the artifacts have no manifest (a damaged attnforge-fa4-kernels install)"])
    if fp == want:
        return Check(True, fp)
    env = manifest.get("env", {})
    reasons = []
    for label, built, here in (
        ("Python", env.get("python"), python),
        ("nvidia-cutlass-dsl", env.get("cutlass"), cutlass),
        ("apache-tvm-ffi", env.get("tvm_ffi"), tvm_ffi),
    ):
        if str(built) != str(here):
            reasons.append(f"{label} {here} here, built with {built}")
    if env.get("sources_sha256") and sources_digest(cute_root) != env["sources_sha256"]:
        reasons.append(
            f"FA4's sources in {cute_root} differ from flash-attn-4 {env.get('flash_attn_4')} the kernels were "
            "built with"
        )
    if not reasons:
        reasons.append(f"fingerprint {fp[:12]} here, built under {want[:12]}")
    return Check(False, fp, reasons)


def seed(cache_dir: Path, artifacts: Path = ARTIFACTS) -> tuple[int, int]:
    """Copy the artifacts' entries into ``cache_dir/<fingerprint>/`` where they are missing or differ in size.

    Each copy goes to a temporary name and is renamed into place (a reader never sees half a file).
    Returns (copied, already present)."""
    manifest = read_manifest(artifacts)
    dest_root = cache_dir / str(manifest["fingerprint"])
    copied = present = 0
    for rel, meta in sorted(dict(manifest.get("entries", {})).items()):
        src = artifacts / ENTRIES / rel
        dest = dest_root / rel
        if dest.is_file() and dest.stat().st_size == int(meta.get("size", -1)):
            present += 1
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.attnforge.tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
        copied += 1
    _STATS["seeded"] += copied
    _STATS["present"] += present
    return copied, present


def stats() -> dict[str, Any]:
    """What this process did: the fingerprint check, entries copied and found, warnings given."""
    return dict(_STATS)


def python_minor() -> str:
    """``3.12`` for this interpreter."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"
