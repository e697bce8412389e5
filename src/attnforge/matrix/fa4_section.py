"""matrix.yaml's ``fa4`` section (pydantic): FlashAttention-4's pinned stack per CUDA major and the calls whose
kernels are compiled ahead of time (``attnforge fa4 build``), checked where the file is read, so every problem
names its file:line:col like the rest of matrix.yaml."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from attnforge.matrix.fa4_cells import CUDA_MAJORS

# What the kernel wheel pins besides the CUDA major's DSL libraries (attnforge.fa4.package: the fingerprint's
# inputs and what the objects were built with), so the stack must pin them to a version.
PINNED_COMMON = ("flash-attn-4", "nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels")
STACK_KEY = re.compile(r"^(common|cuda(\d+))$")
VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")

PositiveInt = Annotated[StrictInt, Field(gt=0)]
HeadDim = Literal[64, 96, 128, 192, 256]  # fa4_cells.HEAD_DIMS (a unit test keeps them equal)


class FA4Declaration(BaseModel):
    """One FA4 call compiled ahead of time (the fields of attnforge.fa4.declare.Declaration)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$", description="letters, digits, '-', '_', '.'")
    head_dim: HeadDim = Field(128, description="Q/K head dim")
    head_dim_v: HeadDim | None = Field(None, description="V head dim (default: head_dim)")
    dtype: Literal["bf16", "fp16"] = "bf16"
    causal: StrictBool = True
    heads_q: PositiveInt = Field(16, description="query heads")
    heads_kv: PositiveInt | None = Field(None, description="key/value heads (default: heads_q); GQA ratio")
    batch: PositiveInt = Field(2, description="the batch the call is compiled at")
    seq_lens: list[PositiveInt] = Field(
        default_factory=lambda: [2048], min_length=1, description="lengths the call is compiled at"
    )
    varlen: StrictBool = Field(False, description="packed sequences (flash_attn_varlen_func)")
    training: StrictBool = Field(True, description="forward + backward; false: forward only")

    @model_validator(mode="after")
    def _gqa(self) -> FA4Declaration:
        if self.heads_kv is not None and self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q {self.heads_q} is not a multiple of heads_kv {self.heads_kv}")
        return self

    def to_json(self) -> dict[str, object]:
        """The declaration as attnforge.fa4.declare reads it (fields left unset are left out)."""
        return self.model_dump(exclude_unset=True)


class FA4Section(BaseModel):
    """matrix.yaml ``fa4``: the FA4 stack per CUDA major and the declared calls (`attnforge docs fa4`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: dict[str, dict[str, str | None]] = Field(
        description="`common`: packages of every CUDA major; `cuda12`, `cuda13`: that major's own "
        "(nvidia-cutlass-dsl-libs-cuXX). Package -> exact version, or null (not pinned)"
    )
    declarations: list[FA4Declaration] = Field(
        default_factory=list, description="FA4 calls whose kernels `attnforge fa4 build` compiles"
    )

    @field_validator("stack")
    @classmethod
    def _stack(cls, v: dict[str, dict[str, str | None]]) -> dict[str, dict[str, str | None]]:
        for key, pins in v.items():
            m = STACK_KEY.match(key)
            if m is None:
                raise ValueError(f"stack key {key!r} must be 'common' or 'cuda<major>' (cuda12, cuda13)")
            if m.group(2) is not None and int(m.group(2)) not in CUDA_MAJORS:
                raise ValueError(
                    f"stack {key}: the CuTe DSL ships libraries for CUDA {', '.join(map(str, CUDA_MAJORS))} only"
                )
            if m.group(2) is not None and not pins.get(f"nvidia-cutlass-dsl-libs-cu{m.group(2)}"):
                raise ValueError(f"stack {key} must pin nvidia-cutlass-dsl-libs-cu{m.group(2)} to a version")
            for dist, version in pins.items():
                if version is not None and not VERSION_RE.match(version):
                    raise ValueError(f"stack {key}: {dist} version {version!r} is not a version")
        missing = [d for d in PINNED_COMMON if not v.get("common", {}).get(d)]
        if missing:
            raise ValueError(
                f"stack common must pin {', '.join(missing)} to a version (the kernel wheel pins them)"
            )
        if not any(k != "common" for k in v):
            raise ValueError("stack needs at least one CUDA major (cuda12, cuda13)")
        return v

    @field_validator("declarations")
    @classmethod
    def _unique(cls, v: list[FA4Declaration]) -> list[FA4Declaration]:
        seen: set[str] = set()
        for d in v:
            if d.name in seen:
                raise ValueError(f"declaration name {d.name!r} is used twice")
            seen.add(d.name)
        return v

    @property
    def version(self) -> str:
        """The pinned flash-attn-4 release."""
        return str(self.stack["common"]["flash-attn-4"])

    @property
    def cuda_majors(self) -> list[int]:
        """The CUDA majors a stack is pinned for."""
        return sorted(int(k.removeprefix("cuda")) for k in self.stack if k != "common")

    def pins(self, cuda_major: int) -> dict[str, str | None]:
        """Every package of the stack of a CUDA major (None: not pinned)."""
        if cuda_major not in self.cuda_majors:
            raise ValueError(f"matrix.yaml's fa4.stack has no cuda{cuda_major}")
        return {**self.stack["common"], **self.stack[f"cuda{cuda_major}"]}

    def requirements(self, cuda_major: int) -> list[str]:
        """``pip install`` lines for the stack of a CUDA major."""
        return [f"{k}=={v}" if v else k for k, v in self.pins(cuda_major).items()]
