"""The kernels a caller needs from a wheel (`which --head-dim D --dtype T --backward`), checked against the
profile a wheel's manifest records: any profile that has them serves, so `which` finds the wheel of the profile
that runs a call a narrower wheel refuses (its RuntimeError names these options)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnforge.core.kernels import head_dims
from attnforge.parity.profile import from_manifest
from attnforge.wheels.naming import LocalParts


def kernel_dim(kernel: str, d: int) -> int | None:
    """The head dim of the kernel that runs head dim `d` (the smallest compiled one at or above it; upstream's
    buckets), None above the largest."""
    return next((h for h in head_dims(kernel) if d <= h), None)


@dataclass(frozen=True)
class Needs:
    """What the calls need: a head dim (None: any), a dtype (None: any), backward kernels."""

    head_dim: int | None = None
    dtype: str | None = None
    backward: bool = False

    def __bool__(self) -> bool:
        return self.head_dim is not None or self.dtype is not None or self.backward

    def describe(self) -> str:
        parts = [f"head dim {self.head_dim}"] if self.head_dim is not None else []
        parts += [f"{self.dtype} kernels"] if self.dtype else []
        parts += ["backward kernels"] if self.backward else []
        return ", ".join(parts)

    def problem(self, manifest: dict[str, Any] | None, local: LocalParts | None) -> str | None:
        """Why a wheel's profile does not serve these calls (None when it does). Without a manifest only the
        full profile (no tag) is known to serve them."""
        tag = (local.profile_tag if local else None) or "full"
        if manifest is None:
            if tag == "full":
                return None
            return f"wheel is profile {tag}, whose kernels are unknown (no manifest beside it)"
        have = from_manifest(manifest)
        missing = []
        if self.head_dim is not None:
            dim = kernel_dim(have.kernel, self.head_dim)
            if dim is None:
                missing.append(f"no {have.kernel} kernel runs head dim {self.head_dim}")
            elif dim not in have.head_dims:
                missing.append(f"head dims {list(have.head_dims)}, not {dim}")
        if self.dtype and self.dtype not in have.dtypes:
            missing.append(f"dtypes [{', '.join(have.dtypes)}], not {self.dtype}")
        if self.backward and not have.backward:
            missing.append("no backward kernels")
        return f"wheel is profile {tag}: {'; '.join(missing)}" if missing else None
