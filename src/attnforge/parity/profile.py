"""What a flash-attn (or flash-attn-3) wheel claims to contain: head dims, dtypes and disabled features.

Read from the wheel's manifest (``<wheel>.manifest.json``, docs/contracts.md) when there is one, else from
the local version's profile tag looked up in matrix.yaml's ``profiles``, else upstream's full set.
Standard library only (PyYAML, when installed, reads matrix.yaml's ``profiles``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnforge import names
from attnforge.core.kernels import dtypes, features, head_dims

ALL_HEAD_DIMS: tuple[int, ...] = head_dims("flash-attn")
ALL_DTYPES: tuple[str, ...] = dtypes("flash-attn")
FEATURES: tuple[str, ...] = features("flash-attn")
_DISABLE_FLAG = re.compile(r"-DFLASHATTENTION_DISABLE_([A-Z0-9_]+)")


@dataclass(frozen=True)
class WheelProfile:
    """The kernels a wheel was built with; ``source`` says where this was read from."""

    name: str = "full"
    head_dims: tuple[int, ...] = ALL_HEAD_DIMS
    dtypes: tuple[str, ...] = ALL_DTYPES
    disabled: frozenset[str] = field(default_factory=frozenset)
    source: str = "default"
    kernel: str = "flash-attn"  # flash-attn-3: cases from fa3cases, run through flash_attn_interface

    @classmethod
    def full(cls, kernel: str, source: str = "default") -> WheelProfile:
        """Everything the kernel has (its head dims, dtypes, features)."""
        return cls(head_dims=head_dims(kernel), dtypes=dtypes(kernel), source=source, kernel=kernel)

    @property
    def backward(self) -> bool:
        return "backward" not in self.disabled

    def has(self, feature: str) -> bool:
        """Whether a feature (one of FEATURES) was compiled in."""
        return feature not in self.disabled

    def describe(self) -> str:
        off = ", ".join(sorted(self.disabled)) or "none"
        what = f"{self.kernel} " if self.kernel != "flash-attn" else ""
        return (
            f"{what}{self.name}: head dims {list(self.head_dims)}, dtypes {list(self.dtypes)}, disabled {off} "
            f"(from {self.source})"
        )


def disabled_from_flags(flags: list[str]) -> frozenset[str]:
    """``-DFLASHATTENTION_DISABLE_BACKWARD`` ... -> {"backward", ...} (unknown macros kept, lowercased)."""
    out = set()
    for f in flags:
        m = _DISABLE_FLAG.search(str(f))
        if m:
            out.add(m.group(1).lower())
    return frozenset(out)


def from_manifest(data: dict[str, Any]) -> WheelProfile:
    """The profile recorded in a manifest's ``inputs`` (and its ``kernel``)."""
    inputs = data.get("inputs") or {}
    kernel = str(data.get("kernel") or "flash-attn")
    dims = tuple(sorted(int(d) for d in inputs.get("head_dims") or head_dims(kernel)))
    dts = tuple(str(d) for d in inputs.get("dtypes") or dtypes(kernel))
    disabled = disabled_from_flags(list(inputs.get("profile_flags") or []))
    if kernel == "flash-attn-3" and "sm_80" not in (inputs.get("arches") or []):
        disabled |= {"sm80"}
    return WheelProfile(
        name=str(inputs.get("profile") or "full"),
        head_dims=dims,
        dtypes=dts,
        disabled=disabled,
        source="manifest",
        kernel=kernel,
    )


def profile_tag(version: str) -> str | None:
    """The profile tag of a version: ``2.8.3+cu130torch2.14cxx11abiTRUE.hd128`` -> ``hd128`` (a custom torch
    build's ``.pt<build>`` is not one); None without a tag or a local version of ours (`attnforge.names`)."""
    parts = names.parse_version(version)
    return parts.profile_tag if parts else None


def from_local_version(
    version: str, profiles: dict[str, dict[str, Any]] | None = None, kernel: str = "flash-attn"
) -> WheelProfile:
    """Resolve the local version's tag against matrix.yaml ``profiles`` (name or ``tag``); no tag = full."""
    tag = profile_tag(version)
    if tag is None:
        return WheelProfile.full(kernel, f"local version {version!r} (no tag: full)")
    for name, spec in (profiles or {}).items():
        spec = spec or {}
        if (spec.get("tag") or name) == tag:
            disabled = frozenset(str(x).lower() for x in spec.get("disable") or [])
            return WheelProfile(
                name=name,
                head_dims=tuple(sorted(int(d) for d in spec.get("head_dims") or head_dims(kernel))),
                dtypes=tuple(spec.get("dtypes") or dtypes(kernel)),
                disabled=disabled,
                source=f"local version tag {tag!r} in matrix.yaml",
                kernel=kernel,
            )
    return WheelProfile(
        name=tag,
        head_dims=head_dims(kernel),
        dtypes=dtypes(kernel),
        kernel=kernel,
        source=f"local version tag {tag!r} (unknown to matrix.yaml: assumed full)",
    )


def matrix_profiles(path: Path) -> dict[str, dict[str, Any]]:
    """``profiles`` of a matrix.yaml, or {} when the file or PyYAML is missing."""
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (ImportError, OSError, ValueError):
        return {}
    profiles = data.get("profiles") if isinstance(data, dict) else None
    return dict(profiles) if isinstance(profiles, dict) else {}


def resolve(
    manifest: Path | None = None,
    version: str | None = None,
    matrix: Path | None = None,
    kernel: str = "flash-attn",
) -> WheelProfile:
    """Manifest first, then the local version (with matrix.yaml's profiles), else full."""
    if manifest is not None and manifest.is_file():
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{manifest}: unreadable manifest ({exc})") from None
        return from_manifest(data)
    if version:
        return from_local_version(version, matrix_profiles(matrix) if matrix else None, kernel)
    return WheelProfile.full(kernel)
