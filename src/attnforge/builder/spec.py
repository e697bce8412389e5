"""The build spec: one dataclass, written by the host (``to_json``) and read by the builder (``from_json``).

Paths are the builder's own: the docker backend mounts host folders at the same paths, so a spec means the
same thing on both sides. Field by field (defaults in the dataclass):

- what: ``cell_id``, ``kernel`` (flash-attn and flash-attn-3 get their knobs; any other torch extension
  builds with the generic ones), ``kernel_version``, ``source`` (archive path,
  sha256, optional url, ``subdir`` holding setup.py), ``local_version``, ``kernel_set_key``;
- against which torch: ``python`` ("3.12", or an absolute interpreter path), ``torch`` (release),
  ``torch_requirement`` (pip requirement; default ``torch==<torch>``), ``torch_variant`` (cu130, rocm6.4;
  None = not checked), ``use_interpreter`` (env backend: build with ``python`` itself and the torch already
  installed there, no venv), ``extra_requirements``, pip's ``pip_args``/``pip_env``/``pip_cache_dir``;
- what gets compiled: ``arches`` (sm_90, gfx942), ``gencode`` (the arch policy's ``-gencode`` pairs, e.g.
  ``arch=compute_100f,code=sm_100``; empty: the kernel's setup.py decides), ``platform`` (x86_64 or aarch64:
  the wheel's host architecture; another than the builder's own is cross-compiled, ``cross``), ``cxx11_abi``, ``patches``, ``disable`` (profile
  features compiled out: backward, dropout, ...), ``head_dims``, ``dtypes``, ``rocm_backend``, ``profile`` (its tag,
  named in a profile build's dispatch errors);
- how: ``settings`` (the host's resolved `settings.BuildSettings`: MAX_JOBS, NVCC_THREADS, job memory, each
  with its source), mirrored in ``max_jobs`` and ``nvcc_threads``; a spec written by hand may give only those
  (``max_jobs`` None = the builder measures cores and memory for one job of ``job_mem_gb``); ``nvcc_append_flags``,
  ``ccache_dir``, ``source_date_epoch``, ``env`` (extra variables, last word), ``cxx_probe``, ``max_gcc``
  (newest gcc the toolkit accepts), ``unit_seconds`` (measured compile time per unit: the longest start
  first);
- where: ``build_dir`` (unpacked tree, kept for resume), ``venv_dir``, ``output_dir`` (wheel, result.json,
  build.log), ``kernel_objects_dir`` (compiled kernel objects shared by cells of one kernel set);
- checks: ``import_check``, ``import_names``, ``stable_abi`` (a stable-ABI, cp3X-abi3 wheel: every compiled
  extension in it must import no torch C++ symbol, only torch's C shim; FA2 with the ``stable-abi`` patch and
  FA3 on torch >= 2.9).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .exits import EXIT_CONFIG, BuildFailure
from .parallelism import DEFAULT_JOB_GB
from .settings import BuildSettings

SCHEMA = 2
DEFAULT_REQUIREMENTS = ["setuptools>=77", "wheel", "packaging", "ninja"]


@dataclass(frozen=True)
class Source:
    """A kernel source archive: an sdist or a source tarball (``subdir`` = where setup.py is inside it)."""

    path: str
    sha256: str
    url: str | None = None
    subdir: str = ""


@dataclass(frozen=True)
class BuildSpec:
    """One cell's build as the builder sees it (see the module docstring for each field)."""

    cell_id: str
    kernel: str
    kernel_version: str
    source: Source
    python: str
    torch: str
    build_dir: str
    venv_dir: str
    output_dir: str
    torch_requirement: str | None = None
    torch_variant: str | None = None
    use_interpreter: bool = False
    extra_requirements: list[str] = field(default_factory=lambda: list(DEFAULT_REQUIREMENTS))
    pip_args: list[str] = field(default_factory=list)
    pip_env: dict[str, str] = field(default_factory=dict)
    pip_cache_dir: str | None = None
    kernel_objects_dir: str | None = None
    kernel_set_key: str | None = None
    local_version: str | None = None
    arches: list[str] = field(default_factory=list)
    cxx11_abi: bool = True
    patches: list[str] = field(default_factory=list)
    disable: list[str] = field(default_factory=list)
    head_dims: list[int] | None = None
    dtypes: list[str] | None = None
    # the profile's tag ("full": the full profile): a profile build's dispatch errors name it (attnforge_dispatch.h)
    profile: str | None = None
    rocm_backend: str | None = None
    max_jobs: int | None = None
    nvcc_threads: int = 1
    job_mem_gb: float = DEFAULT_JOB_GB
    settings: BuildSettings | None = None
    nvcc_append_flags: str | None = None
    ccache_dir: str | None = None
    source_date_epoch: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    cxx_probe: bool = True
    max_gcc: int | None = None
    unit_seconds: dict[str, float] = field(default_factory=dict)
    import_check: bool = True
    import_names: list[str] | None = None
    stable_abi: bool = False
    gencode: list[str] = field(default_factory=list)
    platform: str = "x86_64"
    schema: int = SCHEMA

    @property
    def backward(self) -> bool:
        """Whether backward kernels are compiled (``backward`` not in ``disable``)."""
        return "backward" not in self.disable

    @property
    def pure_python(self) -> bool:
        """A ROCm Triton build: setup.py declares no extension, nothing is compiled."""
        return self.rocm_backend == "triton"

    def shared_paths(self) -> list[Path]:
        """Cache paths other cells share: the venv, the kernel objects, the source archive."""
        return [Path(p) for p in (self.venv_dir, self.kernel_objects_dir, self.source.path) if p]

    def paths(self) -> list[Path]:
        """Every path the build reads or writes (what a cache prune must leave alone while it runs)."""
        own = [Path(p) for p in (self.build_dir, self.output_dir, self.ccache_dir) if p]
        return [*own, *self.shared_paths()]

    def replace(self, **changes: Any) -> BuildSpec:
        """A copy with some fields changed (e.g. fewer ``max_jobs`` after an OOM kill)."""
        return dataclasses.replace(self, **changes)

    def with_settings(self, settings: BuildSettings) -> BuildSpec:
        """A copy that builds with `settings` (the spec's ``max_jobs`` and ``nvcc_threads`` follow them)."""
        return self.replace(settings=settings, max_jobs=settings.max_jobs, nvcc_threads=settings.nvcc_threads)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["settings"] = self.settings.to_json() if self.settings else None
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, data: Any) -> BuildSpec:
        """Check types and names; BuildFailure(EXIT_CONFIG) naming the first key at fault."""
        if not isinstance(data, dict):
            raise BuildFailure(EXIT_CONFIG, "spec must be a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise BuildFailure(EXIT_CONFIG, f"spec: unknown key {unknown[0]!r}")
        required = [
            n
            for n, f in fields.items()
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [n for n in required if data.get(n) is None]
        if missing:
            raise BuildFailure(EXIT_CONFIG, f"spec lacks {', '.join(missing)}")
        if data.get("schema", SCHEMA) != SCHEMA:
            raise BuildFailure(
                EXIT_CONFIG, f"spec schema {data['schema']} is not {SCHEMA} (builder and host differ)"
            )
        values = dict(data)
        src = values["source"]
        if not isinstance(src, dict) or not src.get("path") or not src.get("sha256"):
            raise BuildFailure(EXIT_CONFIG, "spec.source needs path and sha256")
        try:
            values["source"] = Source(**src)
        except TypeError as exc:
            raise BuildFailure(EXIT_CONFIG, f"spec.source: {exc}") from None
        if values.get("settings") is not None:
            try:
                values["settings"] = BuildSettings.from_json(values["settings"])
            except (TypeError, ValueError) as exc:
                raise BuildFailure(EXIT_CONFIG, f"spec.settings: {exc}") from None
        for name, value in values.items():
            _check_type(name, value, fields[name].type)
        spec = cls(**values)
        spec.validate()
        return spec

    @classmethod
    def load(cls, path: Path) -> BuildSpec:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BuildFailure(EXIT_CONFIG, f"cannot read spec {path}: {exc}") from None
        return cls.from_json(data)

    def validate(self) -> None:
        """Values the builder cannot work with."""
        if not re.fullmatch(r"3\.\d+t?", self.python) and not self.python.startswith("/"):
            raise BuildFailure(
                EXIT_CONFIG,
                f"spec.python must be like 3.12, 3.14t (free-threaded) or an absolute path, not {self.python!r}",
            )
        if self.platform not in ("x86_64", "aarch64"):
            raise BuildFailure(EXIT_CONFIG, f"spec.platform must be x86_64 or aarch64, not {self.platform!r}")
        if self.use_interpreter and not self.python.startswith("/"):
            raise BuildFailure(EXIT_CONFIG, "spec.use_interpreter needs an absolute spec.python")
        if self.head_dims is not None and (not self.head_dims or any(d <= 0 for d in self.head_dims)):
            raise BuildFailure(EXIT_CONFIG, f"spec.head_dims {self.head_dims} must be positive head dims")
        if self.nvcc_threads < 1 or (self.max_jobs is not None and self.max_jobs < 1):
            raise BuildFailure(EXIT_CONFIG, "spec.max_jobs and spec.nvcc_threads must be at least 1")
        got = self.settings
        if got is not None and (got.max_jobs, got.nvcc_threads) != (self.max_jobs, self.nvcc_threads):
            raise BuildFailure(
                EXIT_CONFIG,
                f"spec.settings (max_jobs {got.max_jobs}, nvcc_threads {got.nvcc_threads}) disagrees with "
                f"spec.max_jobs {self.max_jobs} and spec.nvcc_threads {self.nvcc_threads}",
            )


_SIMPLE: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "float": (int, float), "bool": bool}


def _check_type(name: str, value: Any, annotation: Any) -> None:
    """A small check of JSON values against the field's annotation (strings under postponed evaluation)."""
    text = str(annotation).replace(" ", "")
    if name in ("source", "settings") or (value is None and "None" in text):
        return
    base = text.replace("|None", "")
    if base in _SIMPLE:
        ok = isinstance(value, _SIMPLE[base]) and not (base in ("int", "float") and isinstance(value, bool))
    elif base.startswith("list["):
        inner: type | tuple[type, ...] = _SIMPLE.get(base[5:-1], object)
        ok = isinstance(value, list) and all(isinstance(v, inner) for v in value)
    elif base.startswith("dict["):
        ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
    else:
        ok = True
    if not ok:
        raise BuildFailure(EXIT_CONFIG, f"spec.{name}: {value!r} is not {base}")
