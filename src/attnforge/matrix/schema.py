"""The matrix.yaml schema (pydantic models). `attnforge schema` exports it as JSON Schema for editors."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from attnforge.builder.parallelism import MAX_JOBS_PER_CORE
from attnforge.core.index_urls import secret_params
from attnforge.core.kernels import KERNELS
from attnforge.core.kernels import head_dims as kernel_head_dims
from attnforge.matrix.ci_section import CiSection
from attnforge.matrix.destinations import Destination
from attnforge.matrix.fa4_section import FA4Section

SCHEMA_VERSION = 1

TOOLKIT_RE = re.compile(r"^(cuda|rocm)(\d+)\.(\d+)$")
ARCH_RE = re.compile(r"^(sm_\d{2,3}[a-z]?|gfx[0-9a-f]{3,4})$")
PY_RE = re.compile(r"^3\.\d{1,2}t?$")  # 3.14t: the free-threaded build (its own ABI, cp314t)
TORCH_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")
NAME_RE = re.compile(r"^[a-z][a-z0-9]*$")

AXES = ("kernel", "toolkit", "torch", "python", "cxx11_abi", "arch", "profile", "platform")
# Every feature a kernel's profile may compile out (kernels.json `features`, all kernels; a unit test keeps
# this list equal to `kernels.all_features()`); the `profile` rule checks them per kernel.
DisableFeature = Literal[
    "backward",
    "dropout",
    "alibi",
    "softcap",
    "uneven_k",
    "local",
    "split",
    "pagedkv",
    "appendkv",
    "packgqa",
    "varlen",
    "cluster",
    "sm80",
    "hdimdiff64",
    "hdimdiff192",
]
Dtype = Literal["fp16", "bf16", "fp8"]  # kernels.json `dtypes` of all kernels (FA3 adds fp8, forward only)


class Strict(BaseModel):
    """Base: unknown keys are errors (the loader turns them into a 'did you mean')."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SourceSpec(Strict):
    """Where a kernel's sources come from; `sha256` pins them (or `attnforge lock` writes attnforge.lock)."""

    kind: Literal["pypi-sdist", "url", "git", "path"] = "pypi-sdist"
    url: str | None = Field(
        None, description="git URL (kind=git) or the archive's URL (kind=url, pypi-sdist)"
    )
    ref: str | None = Field(None, description="git commit or tag (kind=git)")
    path: str | None = Field(
        None,
        description="a local source archive (kind=path), e.g. a `git archive`; relative to matrix.yaml's folder; "
        "${VAR} and ${VAR:-default} are expanded (e.g. ${ATTNFORGE_SOURCES}/x.tar.gz)",
    )
    sha256: str | None = Field(None, description="expected sha256 of the archive (pypi-sdist/url/path)")
    subdir: str | None = Field(
        None, description="folder holding setup.py inside the archive (flash-attn-3: hopper)"
    )

    @model_validator(mode="after")
    def _needs(self) -> SourceSpec:
        if self.kind == "git" and not (self.url and self.ref):
            raise ValueError("source kind 'git' needs both 'url' and 'ref' (a commit or tag)")
        if self.kind == "path" and not self.path:
            raise ValueError("source kind 'path' needs 'path'")
        if self.kind == "url" and not self.url:
            raise ValueError("source kind 'url' needs 'url'")
        if self.subdir is not None and (self.subdir.startswith("/") or ".." in self.subdir.split("/")):
            raise ValueError(f"subdir {self.subdir!r} must be a relative folder inside the archive")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return self


class KernelSpec(Strict):
    """A kernel package to build: flash-attn (FA2) or flash-attn-3 (FlashAttention-3, hopper/ of the
    flash-attention repository: source kind git, url or path with subdir hopper)."""

    version: str
    source: SourceSpec = SourceSpec()


class ProfileSpec(Strict):
    """What gets compiled. Anything but `full` appears in the wheel's local version via `tag`."""

    description: str = ""
    tag: str | None = Field(None, description="local-version tag; defaults to the profile name")
    disable: list[DisableFeature] = Field(
        default_factory=list,
        description="features compiled out: FA2 FLASHATTENTION_DISABLE_<X> macros (backward, dropout, ...), "
        "FA3 FLASH_ATTENTION_DISABLE_<X> switches (backward, split, pagedkv, varlen, ...)",
    )
    head_dims: list[int] | None = Field(None, description="compile only these head dims (None = all)")
    dtypes: list[Dtype] | None = Field(None, description="compile only these dtypes (fp8: FA3 only)")
    rocm_backend: Literal["ck", "triton"] | None = Field(None, description="ROCm only: CK or Triton")

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.match(v):
            raise ValueError(
                f"profile tag {v!r} must be lowercase letters and digits (a PEP 440 local segment)"
            )
        if v is not None and re.match(r"pt\d", v):
            raise ValueError(
                f"profile tag {v!r}: 'pt' + digit starts a custom torch build's segment; choose another"
            )
        return v

    @field_validator("head_dims")
    @classmethod
    def _hd(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            known = sorted({d for k in KERNELS for d in kernel_head_dims(k)})
            bad = [d for d in v if d not in known]
            if bad or not v:
                raise ValueError(
                    f"head_dims must be a non-empty subset of {', '.join(map(str, known))} (got {v})"
                )
            return sorted(set(v))
        return v

    @property
    def is_full(self) -> bool:
        return (
            not self.disable
            and self.head_dims is None
            and self.dtypes is None
            and self.rocm_backend in (None, "ck")
        )


ArchEntry = Annotated[list[str] | str, Field(description="one arch or a list compiled into one wheel")]


class AxisValues(Strict):
    """A target's matrix: every combination of these values is a cell (like GitHub Actions' matrix)."""

    kernel: list[str] | None = None
    toolkit: list[str] | None = None
    torch: list[str] | None = None
    python: list[str] | None = None
    cxx11_abi: list[bool] | None = None
    arch: list[ArchEntry] | None = None
    profile: list[str] | None = None
    platform: list[Literal["x86_64", "aarch64"]] | None = None

    @field_validator("toolkit")
    @classmethod
    def _tk(cls, v: list[str] | None) -> list[str] | None:
        for t in v or []:
            if not TOOLKIT_RE.match(t):
                raise ValueError(f"toolkit {t!r} must look like 'cuda12.8' or 'rocm6.4'")
        return v

    @field_validator("python")
    @classmethod
    def _py(cls, v: list[str] | None) -> list[str] | None:
        for p in v or []:
            if not PY_RE.match(p):
                raise ValueError(
                    f"python {p!r} must look like '3.11' or '3.14t' (free-threaded); quote it in YAML: 3.10 is the "
                    "float 3.1"
                )
        return v

    @field_validator("torch")
    @classmethod
    def _torch(cls, v: list[str] | None) -> list[str] | None:
        for t in v or []:
            if not TORCH_RE.match(t):
                raise ValueError(f"torch {t!r} must look like '2.8' (latest patch) or '2.8.0'")
        return v

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: list[list[str] | str] | None) -> list[list[str] | str] | None:
        for entry in v or []:
            for a in [entry] if isinstance(entry, str) else entry:
                if not ARCH_RE.match(a):
                    raise ValueError(f"arch {a!r} must look like 'sm_90', 'sm_90a' or 'gfx942'")
        return v


class MatrixEntry(Strict):
    """One include/exclude entry: axis name -> single value."""

    kernel: str | None = None
    toolkit: str | None = None
    torch: str | None = None
    python: str | None = None
    cxx11_abi: bool | None = None
    arch: list[str] | str | None = None
    profile: str | None = None
    platform: Literal["x86_64", "aarch64"] | None = None

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class TargetSpec(Strict):
    """A named slice of the matrix (`--target release`)."""

    description: str = ""
    matrix: AxisValues
    include: list[MatrixEntry] = Field(default_factory=list)
    exclude: list[MatrixEntry] = Field(default_factory=list)
    abi: Literal["torch", "stable"] = Field(
        "torch",
        description=(
            "torch: each flash-attn (FA2) cell links one torch release's C++ API (one wheel per torch x Python). "
            "stable: FA2 cells on a torch that has the stable ABI (>= 2.10) build the binding on it instead, "
            "one cp310-abi3 wheel per toolkit x arches x profile x platform for every torch >= 2.10 and "
            "Python >= 3.10; cells of an older torch keep the per-torch binding. FA3 is stable-ABI from "
            "torch 2.9 on either way (its setup.py decides)"
        ),
    )


COUNT_CEILING = MAX_JOBS_PER_CORE * 256


def _count_or_auto(value: Any, least: int) -> Any:
    """A whole number from `least` to COUNT_CEILING, or "auto"; YAML's true/false and fractions are
    refused, not converted."""
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"must be a whole number >= {least} or 'auto' (got {value!r})")
    if value > COUNT_CEILING:
        raise ValueError(
            f"{value:,} is more than any build machine runs at once (at most {COUNT_CEILING:,}: "
            f"{MAX_JOBS_PER_CORE} jobs per core of a {COUNT_CEILING // MAX_JOBS_PER_CORE}-core machine); "
            "'auto' picks from this machine's cores and memory"
        )
    return value


def _amount(value: Any, *, positive: bool, auto: bool) -> Any:
    """A finite number (> 0 when `positive`, else >= 0), or "auto" when allowed."""
    if auto and value == "auto" and isinstance(value, str):
        return value
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        either = " or 'auto'" if auto else ""
        raise ValueError(f"must be a number {bound}{either} (got {value!r})")
    return value


class ResourcesSpec(Strict):
    """Build parallelism. `auto` = chosen from cores and memory available to the build (cgroups included)."""

    max_jobs: int | Literal["auto"] = Field("auto", description="parallel compile jobs: >= 1 or auto")
    nvcc_threads: int | Literal["auto"] = Field("auto", description="nvcc --threads per job: >= 1 or auto")
    memory_per_job_gb: float | Literal["auto"] = Field(
        "auto", description="peak memory of one compile job (> 0); auto = measured table per toolkit/profile"
    )
    reserve_memory_gb: float = Field(
        2.0, description="memory kept free for the system (>= 0; never swap-thrash)"
    )
    parallel_cells: int | Literal["auto"] = Field("auto", description="cells built at once: >= 1 or auto")

    @field_validator("max_jobs", "nvcc_threads", "parallel_cells", mode="before")
    @classmethod
    def _counts(cls, v: Any) -> Any:
        return _count_or_auto(v, 1)

    @field_validator("memory_per_job_gb", mode="before")
    @classmethod
    def _job_memory(cls, v: Any) -> Any:
        return _amount(v, positive=True, auto=True)

    @field_validator("reserve_memory_gb", mode="before")
    @classmethod
    def _reserve(cls, v: Any) -> Any:
        return _amount(v, positive=False, auto=False)


PIP_CREDENTIALS_HINT = (
    "carries credentials: take them out of the URL and put them in a netrc file "
    "(`machine HOST login USER password PASSWORD`, mode 600) named by build.pip.netrc; pip reads it inside "
    "the build, so no command line, spec.json, log or image layer holds them"
)


def _credentialed(url: str) -> bool:
    """A user or password in the URL, or a secret in its query string (`core.index_urls`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return bool(parts.username or parts.password or secret_params(url))


class PipSpec(Strict):
    """pip options for installing torch inside builds; local file:// paths are mounted read-only. Index URLs
    carry no credentials: a netrc file (`netrc`) does."""

    inherit_host_config: bool = Field(True, description="use this machine's pip index/find-links/constraints")
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    find_links: list[str] = Field(default_factory=list)
    netrc: str | None = Field(
        None,
        description="a netrc file with the indexes' credentials (relative to matrix.yaml; ~ and ${VAR} "
        "expanded), handed to pip inside builds as a file, never in a URL",
    )

    @field_validator("index_url")
    @classmethod
    def _index(cls, v: str | None) -> str | None:
        if v is not None and _credentialed(v):
            raise ValueError(f"the URL {PIP_CREDENTIALS_HINT}")  # never the URL itself: it holds the secret
        return v

    @field_validator("extra_index_urls", "find_links")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for i, url in enumerate(v):
            if _credentialed(url):
                raise ValueError(f"entry {i} {PIP_CREDENTIALS_HINT}")
        return v


class BuildSpec(Strict):
    """How cells are built."""

    backend: Literal["auto", "docker", "local"] = "auto"
    resources: ResourcesSpec = ResourcesSpec()
    cache_dir: str = ".attnforge-cache"
    output_dir: str = "wheels"
    extra_ca_bundle: str | None = Field(
        None, description="CA bundle given to builds as a secret, never in a layer"
    )
    base_images: dict[str, str] = Field(
        default_factory=dict, description="toolkit -> base image (default: the compat table's devel image)"
    )
    local_base: bool = Field(
        False,
        description="bootstrap a Debian base locally and install the toolkit from PyPI (air-gapped/no Hub)",
    )
    pip: PipSpec = PipSpec()


class SigningSpec(Strict):
    """The site's signing key and the keys whose records publish trusts (`attnforge docs records`)."""

    key: str | None = Field(
        None,
        description="ed25519 private key (PEM) that signs build and parity records; $ATTNFORGE_SIGNING_KEY wins",
    )
    trusted_keys: list[str] = Field(
        default_factory=list,
        description="public keys (PEM) whose records publish accepts; empty: the signing key's own",
    )


class Matrix(Strict):
    """The whole matrix.yaml."""

    version: Literal[1] = Field(description="schema version of this file")
    kernels: dict[str, KernelSpec]
    profiles: dict[str, ProfileSpec] = Field(default_factory=lambda: {"full": ProfileSpec()})
    defaults: MatrixEntry = MatrixEntry()
    targets: dict[str, TargetSpec]
    build: BuildSpec = BuildSpec()
    destinations: dict[str, Destination] = Field(default_factory=dict)
    signing: SigningSpec = SigningSpec()
    flex: dict[str, Any] = Field(
        default_factory=dict, description="FlexAttention cache variants (see `attnforge docs flex`)"
    )
    fa4: FA4Section | None = Field(None, description="FlashAttention-4: stack per CUDA major, declarations")
    ci: CiSection = Field(
        CiSection(),
        description="generated CI: how its jobs install attnforge (`attnforge ci generate --help`)",
    )

    @field_validator("kernels")
    @classmethod
    def _kernels(cls, v: dict[str, KernelSpec]) -> dict[str, KernelSpec]:
        unknown = [k for k in v if k not in KERNELS]
        if unknown:
            raise ValueError(f"unknown kernel {unknown[0]!r}; supported: {', '.join(KERNELS)}")
        for name, spec in v.items():
            if name == "flash-attn-3" and spec.source.kind == "pypi-sdist":
                raise ValueError(
                    "flash-attn-3 has no sdist on the package index: give source kind git (url, ref), "
                    "url or path, with subdir hopper"
                )
            if name == "flash-attn-3" and not spec.source.subdir:
                raise ValueError(
                    "flash-attn-3: source.subdir must name the folder with its setup.py (hopper); "
                    "setup.py finds cutlass at ../csrc/cutlass"
                )
        return v

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, v: dict[str, ProfileSpec]) -> dict[str, ProfileSpec]:
        for name in v:
            if not NAME_RE.match(name):
                raise ValueError(f"profile name {name!r} must be lowercase letters and digits")
        return v
