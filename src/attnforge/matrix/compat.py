"""Typed access to the compatibility tables in `attnforge/data/compat.toml` (data stays data)."""

from __future__ import annotations

import functools
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, ValidationError

from attnforge.core.errors import ConfigurationError
from attnforge.core.kernels import head_dims as kernel_head_dims

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class Row(BaseModel):
    """A table row: extra fields are kept (the data may grow), every row names its source."""

    model_config = ConfigDict(extra="allow", frozen=True)
    source: str
    confidence: str = "documented"


class TorchRelease(Row):
    family: str
    latest: str
    released: str = ""
    python: list[str]
    cuda: list[str] = []
    pypi_cuda: str | None = None
    rocm: list[str] = []
    cxx11_abi: list[bool] = [True]
    cxx11_abi_by_variant: dict[str, bool] = {}  # "cu124" -> False: the one ABI of that variant's wheels
    cxx_std: int = 17
    aarch64_cuda: list[str] = []
    free_threaded: list[str] = []  # CPython releases with free-threaded (cp3XYt) Linux wheels: ["3.14"]
    # the type of at::PhiloxCudaState::offset_intragraph_ in its headers (uint32_t, uint64_t)
    philox_offset_intragraph: str | None = None


class CudaToolkit(Row):
    version: str
    min_driver: str = ""
    arches: list[str]
    max_gcc: int | None = None
    devel_image: str | None = None
    runtime_image: str | None = None


class RocmRelease(Row):
    version: str
    gfx: list[str]
    dev_image: str | None = None


class KernelRelease(Row):
    name: str
    version: str
    min_torch: str = "2.0"
    min_torch_reason: str = ""
    min_cuda: str = "11.7"
    recommended_cuda: str | None = None
    fetched_toolchain_cuda: list[str] = []  # toolkits for which setup.py downloads another nvcc (FA3)
    min_arch: str = "sm_80"
    arches: list[str] = []  # the only arches the kernel compiles (FA3), empty = any the toolkit has
    required_arches: list[str] = []  # arches every wheel of it compiles (FA3: sm_90a)
    default_cuda_archs: list[str] = []
    cxx_std: int = 17
    torch_headers: str = "full"  # "stable": only torch's stable/header-only API (no C++20 need)
    stable_abi_torch: str | None = None  # from this torch on: one stable-ABI (abi3) wheel for every torch
    abi3_python: str | None = None  # the CPython floor of that abi3 wheel
    torch_free_patch: str | None = None  # the patch that takes torch out of the kernel units
    stable_binding_torch: str | None = (
        None  # a target with `abi: stable`: a stable-ABI binding from this torch on
    )
    stable_binding_patch: str | None = None  # ... the patch that builds it (FA2: stable-abi)
    stable_binding_source: str = ""  # where the stable API it uses comes from
    head_dims: list[int] = list(kernel_head_dims("flash-attn"))
    dtypes: list[str] = ["fp16", "bf16"]
    always_dtypes: list[str] = []  # compiled in every wheel (no switch)
    fwd_only_dtypes: list[str] = []
    disable_macros: list[str] = []
    rocm_min: str | None = None
    rocm_backends: list[str] = []
    ck_gfx: list[str] = []
    triton_amd_gfx: list[str] = []
    sdist_sha256: str | None = None


class NgcRelease(Row):
    release: str
    torch: str
    cuda: str
    python: str
    cxx11_abi: bool = True
    flash_attn: str | None = None
    ubuntu: str | None = None


class BaseOs(Row):
    """A builder base's operating system: its glibc and the g++ majors its archive offers."""

    name: str  # the tag suffix nvidia/cuda and attnforge's stand-ins use: ubuntu22.04, debian12
    codename: str  # jammy, bookworm (local/debian:<codename>)
    glibc: str
    gcc_default: int
    gcc: list[int]


class PythonRelease(Row):
    """A CPython release and the first torch release with Linux x86_64 wheels for it."""

    version: str
    first_torch: str


class ArchPolicy(Row):
    """How a kernel's CUDA cells compile their arches on a range of toolkits: family targets (`sm_100` built
    from `compute_100f`), PTX of the newest arch, and the arches every wheel needs (FA3: sm_90a)."""

    kernel: str
    min_cuda: str
    max_cuda: str | None = None  # inclusive; None: every newer toolkit
    family: dict[str, str] = {}  # sm_100 -> sm_100f: the virtual arch its SASS is compiled from
    family_from: dict[str, str] = {}  # sm_110 -> "13.0": a family target newer than min_cuda
    ptx: str = "none"  # "newest": PTX of the newest numeric arch embedded (JIT on any newer GPU)
    gencode: str = "policy"  # "policy": attnforge passes the -gencode list; "setup": the kernel's setup.py


class DriverFloor(Row):
    cuda_major: int
    min_driver: str


class CompatData(BaseModel):
    """All tables, indexed for the rule engine."""

    model_config = ConfigDict(frozen=True)
    torch: list[TorchRelease]
    cuda: list[CudaToolkit]
    rocm: list[RocmRelease] = []
    kernel: list[KernelRelease]
    ngc: list[NgcRelease] = []
    driver: list[DriverFloor] = []
    base_os: list[BaseOs] = []
    python: list[PythonRelease] = []
    arch_policy: list[ArchPolicy] = []

    def arch_policy_for(self, kernel: str, cuda: str) -> ArchPolicy | None:
        """The arch policy row of a kernel on CUDA `cuda` ("13.0"), or None."""
        v = parse_version(cuda)
        for row in self.arch_policy:
            if row.kernel != kernel or v < parse_version(row.min_cuda):
                continue
            if row.max_cuda is None or v <= parse_version(row.max_cuda):
                return row
        return None

    def torch_release(self, version: str) -> TorchRelease | None:
        """Find the family row for '2.8' or '2.8.0'."""
        family = ".".join(version.split(".")[:2])
        return next((t for t in self.torch if t.family == family), None)

    def python_release(self, version: str) -> PythonRelease | None:
        """The row of a CPython release ("3.14"; a free-threaded "3.14t" reads the same row)."""
        return next((p for p in self.python if p.version == version.removesuffix("t")), None)

    def cuda_toolkit(self, version: str) -> CudaToolkit | None:
        return next((c for c in self.cuda if c.version == version), None)

    def rocm_release(self, version: str) -> RocmRelease | None:
        return next((r for r in self.rocm if r.version == version), None)

    def kernel_release(self, name: str, version: str) -> KernelRelease | None:
        return next((k for k in self.kernel if k.name == name and k.version == version), None)

    def os_of_image(self, image: str) -> BaseOs | None:
        """The OS an image's tag names (`...-devel-ubuntu22.04`, `local/debian:bookworm`), or None."""
        name = image.split("@", 1)[0]
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
        words = set(re.split(r"[-_]", tag))
        return next((o for o in self.base_os if o.name in words or o.codename in words), None)


@functools.lru_cache(maxsize=4096)
def parse_version(text: str) -> Version:
    """A packaging Version; invalid text sorts as 0 so a rule can name it instead of crashing."""
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


# The key of each table's rows: an overlay row with the same key replaces the packaged row.
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "torch": ("family",),
    "cuda": ("version",),
    "rocm": ("version",),
    "kernel": ("name", "version"),
    "ngc": ("release",),
    "driver": ("cuda_major",),
    "base_os": ("name",),
    "python": ("version",),
    "arch_policy": ("kernel", "min_cuda"),
}
PACKAGED = "attnforge/data/compat.toml"


def row_key(table: str, row: dict[str, Any]) -> tuple[Any, ...]:
    """The key of a row of `table` (its fields named in ROW_KEYS)."""
    return tuple(row.get(k) for k in ROW_KEYS.get(table, ()))


def _read_toml(raw: bytes, name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = tomllib.loads(raw.decode("utf-8"))
        return data
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"compatibility data {name}: {exc}") from None


def packaged_tables() -> dict[str, Any]:
    """The packaged tables as parsed TOML (attnforge/data/compat.toml)."""
    return _read_toml(resources.files("attnforge").joinpath("data/compat.toml").read_bytes(), PACKAGED)


def merge_overlay(base: dict[str, Any], overlay: dict[str, Any], name: str) -> dict[str, Any]:
    """`overlay`'s rows over `base`'s: a row with the same key (ROW_KEYS) replaces the base row in place,
    a new row is added at the end of its table. `[meta] standalone = true` in the overlay: it replaces
    the base entirely (a complete table of its own)."""
    if (overlay.get("meta") or {}).get("standalone") is True:
        return overlay
    merged: dict[str, Any] = {k: list(v) if isinstance(v, list) else v for k, v in base.items()}
    for table, rows in overlay.items():
        if table == "meta":
            continue
        if table not in ROW_KEYS or not isinstance(rows, list):
            raise ConfigurationError(
                f"compatibility overlay {name}: unknown table [[{table}]] "
                f"(known: {', '.join(sorted(ROW_KEYS))})"
            )
        out: list[Any] = merged.setdefault(table, [])
        for row in rows:
            if not isinstance(row, dict):
                raise ConfigurationError(f"compatibility overlay {name}: [[{table}]] holds a non-table")
            key = row_key(table, row)
            at = next((i for i, old in enumerate(out) if row_key(table, old) == key), None)
            if at is None:
                out.append(row)
            else:
                out[at] = row
    return merged


def compat_tables(path: str | None = None) -> dict[str, Any]:
    """The tables in use as parsed TOML: the packaged ones with the overlay at `path` merged over them."""
    data = packaged_tables()
    if path:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"compatibility overlay {path}: {exc.strerror or exc}") from None
        data = merge_overlay(data, _read_toml(raw, path), path)
    return data


@functools.lru_cache(maxsize=4)
def load_compat(path: str | None = None) -> CompatData:
    """The packaged tables, with the overlay given with --compat / ATTNFORGE_COMPAT merged over them."""
    data = dict(compat_tables(path))
    name = f"{PACKAGED} + {path}" if path else PACKAGED
    data.pop("meta", None)
    try:
        return CompatData.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ConfigurationError(f"compatibility data {name}: {loc}: {err['msg']}") from None
