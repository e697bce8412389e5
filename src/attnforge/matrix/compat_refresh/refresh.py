"""`compat refresh`: read torch, CPython, CUDA toolkit and kernel releases off the package index and compare
them with the compat tables in use (rows as parsed TOML, the overlay merged)."""

from __future__ import annotations

import datetime
import re
from typing import Any

from packaging.version import InvalidVersion, Version

from attnforge.matrix.compat_refresh.findings import Finding, Report
from attnforge.matrix.compat_refresh.index import Index
from attnforge.matrix.compat_refresh.torch_facts import (
    TorchFamily,
    families,
    first_torch_per_python,
    linux_wheels,
    listing_facts,
    wheel_facts,
)

# [[torch]] fields compared with the index (lists compared as sets); `cuda`/`aarch64_cuda` are checked to
# hold PyPI's variant (the other variants live on PyTorch's own indexes).
TORCH_FIELDS = (
    "latest",
    "released",
    "latest_released",
    "python",
    "free_threaded",
    "requires_python",
    "pypi_cuda",
    "pypi_aarch64_cuda",
    "cxx_std",
    "philox_offset_intragraph",
)
# compared even where the row leaves them out (its default would claim something): what a row must state, and
# the facts read out of wheels (only for a new family, a new patch release and the newest family)
ALWAYS_COMPARED = (
    "latest",
    "python",
    "free_threaded",
    "pypi_cuda",
    "pypi_aarch64_cuda",
    "cxx_std",
    "philox_offset_intragraph",
)
NEW_ROW_NOTE = (
    "Written by attnforge compat refresh from the package index: only the index's own CUDA variant is "
    "listed (PyTorch's per-variant indexes and ROCm builds are not read)."
)


def _v(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return sorted(map(str, a)) == sorted(map(str, b))
    return bool(a == b)


def refresh(
    tables: dict[str, Any], index: Index, pins: dict[str, str] | None = None, today: str | None = None
) -> Report:
    """Compare `tables` (the compat data in use) with `index`; `pins` maps projects pinned elsewhere (the
    matrix's FA4 stack: {"flash-attn-4": "4.0.0b36"}) to their pin."""
    date = today or datetime.date.today().isoformat()
    report = Report(index.name, date)
    torch_files = index.files("torch")
    wheels = linux_wheels(torch_files)
    report.findings += _torch(tables.get("torch", []), wheels, index, date)
    report.findings += _python(tables.get("python", []), wheels, index.name, date)
    report.findings += _toolkits(tables, index)
    report.findings += _kernels(tables.get("kernel", []), index, pins or {})
    return report


def _torch(rows: list[dict[str, Any]], wheels: Any, index: Index, date: str) -> list[Finding]:
    by_family = {r["family"]: r for r in rows}
    known = sorted(by_family, key=_v)
    if not known:
        return []
    newest_known = known[-1]
    out = []
    for fam, fam_wheels in sorted(families(wheels).items(), key=lambda kv: _v(kv[0])):
        if _v(fam) < _v(known[0]):
            continue
        facts = listing_facts(fam, fam_wheels)
        row = by_family.get(fam)
        deep = row is None or fam == newest_known or row.get("latest") != facts.facts["latest"]
        if deep:
            wheel_facts(index, facts, fam_wheels)
        out += _torch_finding(fam, facts, row, deep, index.name, date)
    return out


def _source(facts: TorchFamily, index: str, date: str) -> str:
    return f"attnforge compat refresh {date} from {index}: " + "; ".join(facts.sources)


def _torch_finding(
    fam: str, facts: TorchFamily, row: dict[str, Any] | None, deep: bool, index: str, date: str
) -> list[Finding]:
    f = facts.facts
    if row is None:
        needed = ("pypi_cuda", "cxx_std", "philox_offset_intragraph", "cxx11_abi")
        missing = [k for k in needed if k in facts.unknown]
        if missing:
            why = "; ".join(f"{k}: {facts.unknown[k]}" for k in missing)
            return [
                Finding(
                    "torch", fam, "unestablished", f"torch {f['latest']} on the index, row left out ({why})"
                )
            ]
        new: dict[str, Any] = {
            "family": fam,
            **{k: f[k] for k in ("latest", "released", "latest_released") if k in f},
        }
        new |= {k: f[k] for k in ("python", "requires_python", "cuda", "pypi_cuda") if k in f}
        new |= {
            "rocm": [],
            "cxx11_abi": f["cxx11_abi"],
            "cxx_std": f["cxx_std"],
            "ext_default_std": f["cxx_std"],
        }
        new |= {k: f[k] for k in ("philox_offset_intragraph", "aarch64_cuda", "free_threaded") if k in f}
        if "pypi_aarch64_cuda" in f:
            new["pypi_aarch64_cuda"] = f["pypi_aarch64_cuda"]
        new |= {"notes": NEW_ROW_NOTE, "refreshed": date, "source": _source(facts, index, date)}
        return [Finding("torch", fam, "new", f"torch {f['latest']}: Python {', '.join(f['python'])}", new)]
    changes: dict[str, tuple[Any, Any]] = {}
    for name in TORCH_FIELDS:
        if name not in f or _same(row.get(name, []), f[name]):
            continue
        if name in row or name in ALWAYS_COMPARED:
            changes[name] = (row.get(name), f[name])
    if "cxx11_abi" in f and f["cxx11_abi"][0] not in row.get("cxx11_abi", [True]):
        changes["cxx11_abi"] = (row.get("cxx11_abi"), sorted({*row.get("cxx11_abi", []), *f["cxx11_abi"]}))
    for lst, one in (("cuda", "pypi_cuda"), ("aarch64_cuda", "pypi_aarch64_cuda")):
        if one in f and f[one] not in row.get(lst, []):
            changes[lst] = (row.get(lst, []), sorted([*row.get(lst, []), f[one]], key=_v))
    if not changes:
        return []
    updated = dict(row) | {k: new for k, (_, new) in changes.items()}
    updated |= {"refreshed": date, "source": f"{row.get('source', '')}; {_source(facts, index, date)}"}
    what = ", ".join(changes)
    return [Finding("torch", fam, "changed", f"the index differs in {what}", updated, changes)]


def _python(rows: list[dict[str, Any]], wheels: Any, index: str, date: str) -> list[Finding]:
    by_version = {r["version"]: r for r in rows}
    out = []
    oldest = min((_v(v) for v in by_version), default=Version("0"))
    for py, first in sorted(first_torch_per_python(wheels).items(), key=lambda kv: _v(kv[0])):
        if _v(py) < oldest:
            continue
        row = by_version.get(py)
        if row is not None and row.get("first_torch") == first:
            continue
        source = (
            f"attnforge compat refresh {date} from {index}: the oldest torch release with a Linux x86_64 "
            f"cp{py.replace('.', '')}-cp{py.replace('.', '')} wheel (free-threaded builds excluded)"
        )
        new = {"version": py, "first_torch": first, "refreshed": date, "source": source}
        if row is None:
            out.append(Finding("python", py, "new", f"CPython {py}: first torch wheel {first}", new))
        else:
            changes = {"first_torch": (row.get("first_torch"), first)}
            out.append(
                Finding("python", py, "changed", "first torch release differs", dict(row) | new, changes)
            )
    return out


_MEASURED = re.compile(r"nvidia-cuda-nvcc(?:-cu\d+)? (\d+\.\d+\.\d+)")


def _toolkits(tables: dict[str, Any], index: Index) -> list[Finding]:
    """CUDA toolkits on the index (nvidia-cuda-nvcc): a minor without a row is reported, never written (its
    driver floor comes from NVIDIA's release notes and its arches from running ptxas)."""
    rows = {r["version"]: r for r in tables.get("cuda", [])}
    newest: dict[str, Version] = {}
    for f in index.files("nvidia-cuda-nvcc"):
        m = re.match(r"nvidia_cuda_nvcc-([^-]+)-", f.filename)
        v = _v(m.group(1)) if m else Version("0")
        if v == Version("0") or v.is_prerelease or v.is_devrelease:
            continue
        minor = f"{v.major}.{v.minor}"
        newest[minor] = max(newest.get(minor, v), v)
    torch_cuda = {r.get("pypi_cuda") for r in tables.get("torch", []) if r.get("pypi_cuda")}
    out = []
    for minor, v in sorted(newest.items(), key=lambda kv: _v(kv[0])):
        row = rows.get(minor)
        if row is None:
            why = "min_driver is in NVIDIA's release notes and arches need ptxas --help: not read from the index"
            out.append(
                Finding(
                    "cuda", minor, "unestablished", f"nvidia-cuda-nvcc {v} on the index; row left out: {why}"
                )
            )
            continue
        m = _MEASURED.search(str(row.get("measured_from", "")))
        if m and _v(m.group(1)) < v:
            out.append(Finding("cuda", minor, "note", f"measured from nvcc {m.group(1)}; the index has {v}"))
    for minor in sorted(torch_cuda - set(rows) - set(newest), key=_v):
        out.append(
            Finding(
                "cuda",
                minor,
                "unestablished",
                "a torch row names this CUDA; no toolkit row, no nvcc on the index",
            )
        )
    return out


def _kernels(rows: list[dict[str, Any]], index: Index, pins: dict[str, str]) -> list[Finding]:
    """The newest flash-attn release and FA4 beta: a release without a row (or newer than the pin) is reported;
    a kernel row needs its build checks (sources diffed, compiled against each torch), never written here."""
    out = []
    for project, pre in (("flash-attn", False), ("flash-attn-4", True), ("flash-attn-3", False)):
        versions = set()
        for f in index.files(project):
            m = re.match(rf"{project.replace('-', '_')}-([^-]+?)(?:\.tar\.gz|\.zip|-)", f.filename)
            v = _v(m.group(1)) if m else Version("0")
            if v > Version("0.0.0") and (pre or not v.is_prerelease) and not v.is_devrelease:
                versions.add(v)
        if not versions:
            continue
        top = str(max(versions))
        have = {r["version"] for r in rows if r.get("name") == project}
        if project in pins:
            if _v(pins[project]) < _v(top):
                out.append(
                    Finding(
                        "kernel",
                        f"{project} {top}",
                        "unestablished",
                        f"newer than the matrix pin {pins[project]}",
                    )
                )
        elif have and top not in have:  # a project the data in use tracks
            out.append(
                Finding(
                    "kernel",
                    f"{project} {top}",
                    "unestablished",
                    "no [[kernel]] row: needs its build checks first",
                )
            )
    return out
