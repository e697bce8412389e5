"""Checks of a stable-ABI wheel under torch releases other than the one it was built against, kept beside the
wheel (`<wheel>.torch-checks.json`) and published with it: which torch, which Python, what kind of check
(`cpu-import-trace`: imported, its ops registered, forward and backward traced on meta tensors, no GPU;
`gpu-parity`: the parity suite on a GPU), passed or not, and the wheel bytes it was about (sha256)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnforge.builder.files import atomic_write_text
from attnforge.core.errors import ConfigurationError
from attnforge.wheels.records import TORCH_CHECKS_SUFFIX

KINDS = ("cpu-import-trace", "gpu-parity")


@dataclass
class TorchCheck:
    """One check of the wheel under one torch build."""

    torch: str  # as torch.__version__ says: 2.15.0+cu132
    python: str
    kind: str
    passed: bool
    date: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return ".".join(self.torch.split("+")[0].split(".")[:2])


def checks_path(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + TORCH_CHECKS_SUFFIX)


def parse_checks(data: Any, sha256: str | None = None) -> list[TorchCheck]:
    """The checks of a torch-checks document; those about other bytes than `sha256` are left out."""
    if not isinstance(data, dict) or (sha256 and data.get("sha256") != sha256):
        return []
    out = []
    for c in data.get("checks") or []:
        try:
            out.append(TorchCheck(**c))
        except TypeError:
            continue
    return out


def read_checks(wheel: Path, sha256: str | None = None) -> list[TorchCheck]:
    """The checks recorded beside `wheel` (none when absent or unreadable)."""
    try:
        return parse_checks(json.loads(checks_path(wheel).read_text()), sha256)
    except (OSError, ValueError):
        return []


def add_check(wheel: Path, sha256: str, check: TorchCheck) -> Path:
    """Record `check` beside `wheel` (a check of the same torch, Python and kind is replaced)."""
    if check.kind not in KINDS:
        raise ConfigurationError(f"torch check kind {check.kind!r}: expected one of {', '.join(KINDS)}")
    kept = [
        c
        for c in read_checks(wheel, sha256)
        if (c.torch, c.python, c.kind) != (check.torch, check.python, check.kind)
    ]
    doc = {"wheel": wheel.name, "sha256": sha256, "checks": [asdict(c) for c in [*kept, check]]}
    path = checks_path(wheel)
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    return path
