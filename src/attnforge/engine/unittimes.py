"""Measured compile time and peak memory per translation unit: a packaged seed (`data/unit_times.json`)
and a per-machine table in the cache (`<cache>/unit_times.json`) that every successful build updates.

A row's key is what decides a unit's compile cost: kernel, kernel version, toolkit, unit (file stem),
number of arches and the profile's feature flags (`kernel/version/toolkit/unit/a<arches>/<flags>`). Times
are seconds of one compile job (one core) on the machine that measured them. The seed's rows are
converted to its reference machine through the units both machines measured; this machine's rows are
used as they are, and the seed is scaled by the median ratio of the units both know (`factor`). A unit
nobody measured is estimated from related rows (other dtype, the nearest head dim of the same kind and
causality, kernel release, toolkit, arch count or flags), then from the median of its kind. Estimates
order units (longest first), size jobs, drive the progress view's ETA and `plan --cost`.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

KERNEL_UNIT_RE = re.compile(
    r"^flash_(?P<kind>fwd_split|fwd|bwd)_hdim(?P<hdim>\d+)_(?P<dtype>fp16|bf16)(?P<causal>_causal)?_sm\d+$"
)
BINDING_UNIT = "flash_api"
FEATURE_FLAGS = ("alibi", "dropout", "local", "softcap", "uneven_k")  # what shortens a kernel unit
LEAN_FACTOR = 0.35  # all five compiled out: 64 s vs 186 s for fwd hdim128 bf16 sm_90, nvcc 13.0, one unit compiled alone on a 2-core x86-64 host
DEFAULT_S = 120.0
KEEP_RUNS = 5
MIN_REAL_RSS_GB = 0.1  # a unit whose compiler never grew past this was a ccache hit (or not sampled)


def flags_of(disable: Iterable[str]) -> str:
    """The flags part of a key: the profile's compiled-out features, sorted ("-" for none)."""
    return "+".join(sorted({d.lower() for d in disable})) or "-"


def unit_key(kernel: str, version: str, toolkit: str, unit: str, arches: int, flags: str) -> str:
    return f"{kernel}/{version}/{toolkit}/{unit}/a{arches}/{flags}"


def unit_kind(unit: str) -> str:
    """fwd, fwd_split, bwd, binding, or other."""
    if unit == BINDING_UNIT:
        return "binding"
    m = KERNEL_UNIT_RE.match(unit)
    return m.group("kind") if m else "other"


def flags_scale(flags: str) -> float:
    """Relative cost of a kernel unit under these flags (1.0 with every feature compiled in)."""
    off = set() if flags == "-" else set(flags.split("+"))
    return 1.0 - (1.0 - LEAN_FACTOR) * len(off & set(FEATURE_FLAGS)) / len(FEATURE_FLAGS)


@dataclass(frozen=True)
class Estimate:
    """Seconds of one compile job, its peak RSS (GiB, None when unknown) and where the numbers come from."""

    s: float
    peak_rss_gb: float | None
    source: str


def _split(key: str) -> tuple[str, str, str, str, int, str]:
    kernel, version, toolkit, unit, arches, flags = key.split("/")
    return kernel, version, toolkit, unit, int(arches[1:]), flags


def _factor(num: dict[str, float], den: dict[str, float]) -> float | None:
    """Median of num[k] / den[k] over the keys both have, None when they share none."""
    ratios = [num[k] / den[k] for k in num.keys() & den.keys() if den[k] > 0]
    return statistics.median(ratios) if ratios else None


class UnitTimeTable:
    """The seed plus this machine's measured rows; `estimate` answers for any unit."""

    def __init__(self, measured_path: Path | None = None, seed: dict[str, Any] | None = None) -> None:
        if seed is None:
            text = resources.files("attnforge").joinpath("data/unit_times.json").read_text(encoding="utf-8")
            seed = json.loads(text)
        self.reference = str(seed["reference_machine"])
        by_machine: dict[str, dict[str, dict[str, Any]]] = {}
        for row in seed["units"]:
            key = unit_key(
                row["kernel"], row["version"], row["toolkit"], row["unit"], int(row["arches"]), row["flags"]
            )
            by_machine.setdefault(row["machine"], {})[key] = row
        ref = {k: float(r["s"]) for k, r in by_machine.get(self.reference, {}).items()}
        self.seed: dict[str, Estimate] = {}
        for machine, rows in sorted(by_machine.items(), key=lambda mr: mr[0] != self.reference):
            to_ref = (
                1.0
                if machine == self.reference
                else _factor(ref, {k: float(r["s"]) for k, r in rows.items()})
            )
            for key, row in rows.items():
                if key in self.seed:
                    continue
                note = "" if machine == self.reference else f" x{to_ref or 1.0:.2f} to {self.reference}"
                peak = row.get("peak_rss_gb")
                self.seed[key] = Estimate(
                    float(row["s"]) * (to_ref or 1.0),
                    float(peak) if peak else None,
                    f"seed ({machine}{note}): {row.get('source', '')}",
                )
        self.measured_path = measured_path
        self.measured: dict[str, dict[str, Any]] = {}
        if measured_path and measured_path.is_file():
            try:
                self.measured = dict(json.loads(measured_path.read_text(encoding="utf-8")).get("units", {}))
            except (OSError, ValueError, AttributeError):
                self.measured = {}

    @property
    def factor(self) -> float:
        """This machine's seconds per seed (reference-machine) second; 1.0 before any overlap."""
        mine = {k: float(r["s"]) for k, r in self.measured.items()}
        return _factor(mine, {k: e.s for k, e in self.seed.items()}) or 1.0

    def _exact(self, key: str, factor: float) -> Estimate | None:
        row = self.measured.get(key)
        if row:
            peak = row.get("peak_rss_gb")
            return Estimate(
                float(row["s"]), float(peak) if peak else None, f"measured here ({len(row['runs'])} runs)"
            )
        seeded = self.seed.get(key)
        if seeded:
            return Estimate(
                seeded.s * factor,
                seeded.peak_rss_gb,
                seeded.source + (f"; x{factor:.2f} for this machine" if factor != 1.0 else ""),
            )
        return None

    def _relatives(self, key: str) -> Iterator[tuple[str, float, list[str], int]]:
        """Keys whose times stand in for ``key``, with the scale to apply, how each one differs and how far
        its head dim is from ``key``'s."""
        kernel, version, toolkit, unit, arches, flags = _split(key)
        known = set(self.measured) | set(self.seed)
        m = KERNEL_UNIT_RE.match(unit)
        for cand in sorted(known):
            k2, v2, t2, u2, a2, f2 = _split(cand)
            if k2 != kernel or cand == key:
                continue
            why, hdim_gap = [], 0
            if u2 != unit:
                m2 = KERNEL_UNIT_RE.match(u2)
                if not m or not m2 or (m2["kind"], m2["causal"]) != (m["kind"], m["causal"]):
                    continue
                if m2["dtype"] != m["dtype"]:
                    why.append("other dtype")
                if m2["hdim"] != m["hdim"]:  # the nearest measured head dim stands in, unscaled
                    why.append(f"head dim {m2['hdim']}")
                    hdim_gap = abs(int(m2["hdim"]) - int(m["hdim"]))
            scale = arches / a2
            if (v2, t2) != (version, toolkit):
                why.append(f"{v2}/{t2}")
            if a2 != arches:
                why.append(f"{a2} arch(es) scaled")
            if f2 != flags:  # the binding's cost does not follow the kernels' feature macros
                if unit_kind(unit) != "binding":
                    scale *= flags_scale(flags) / flags_scale(f2)
                why.append(f"flags {f2}" + (" scaled" if unit_kind(unit) != "binding" else ""))
            yield cand, scale, why, hdim_gap

    def estimate(
        self, kernel: str, version: str, toolkit: str, unit: str, arches: int, flags: str
    ) -> Estimate:
        """Seconds (and peak RSS) of one compile job of ``unit`` on this machine."""
        key = unit_key(kernel, version, toolkit, unit, arches, flags)
        factor = self.factor
        exact = self._exact(key, factor)
        if exact:
            return exact
        best: tuple[tuple[int, int], Estimate] | None = None
        for cand, scale, why, hdim_gap in self._relatives(key):
            est = self._exact(cand, factor)
            if est is None:
                continue
            # fewer and unscaled differences first, then the nearest head dim
            rank = (len(why) + sum("scaled" in w for w in why), hdim_gap)
            if best is None or rank < best[0]:
                best = (rank, Estimate(est.s * scale, est.peak_rss_gb, f"from {cand} ({', '.join(why)})"))
        if best:
            return best[1]
        kind = unit_kind(unit)
        same_kind = [
            e.s * factor * flags_scale(flags) / flags_scale(_split(k)[5]) * arches / _split(k)[4]
            for k, e in self.seed.items()
            if unit_kind(_split(k)[3]) == kind and _split(k)[0] == kernel
        ]
        if same_kind:
            return Estimate(statistics.median(same_kind), None, f"median of seeded {kind} units")
        return Estimate(DEFAULT_S * factor, None, "default (nothing measured for this kind of unit)")

    def record(
        self,
        kernel: str,
        version: str,
        toolkit: str,
        arches: int,
        flags: str,
        unit_times: dict[str, dict[str, Any]],
        note: str,
    ) -> int:
        """Add a build's unit times (result.json ``unit_times``) to this machine's table; rows whose
        compiler never grew past ``MIN_REAL_RSS_GB`` (ccache hits) are skipped. Returns rows recorded."""
        if not self.measured_path:
            return 0
        data: dict[str, Any] = {"units": {}}
        if self.measured_path.is_file():
            try:
                data = json.loads(self.measured_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {"units": {}}
        rows: dict[str, Any] = data.setdefault("units", {})
        count = 0
        for unit, t in unit_times.items():
            secs, peak = float(t.get("s") or 0), float(t.get("peak_rss_gb") or 0)
            if secs <= 0 or peak < MIN_REAL_RSS_GB:
                continue
            key = unit_key(kernel, version, toolkit, unit, arches, flags)
            row = rows.get(key) or {"runs": [], "peak_rss_gb": 0.0}
            row["runs"] = [*row["runs"], round(secs, 1)][-KEEP_RUNS:]
            row["s"] = round(statistics.median(row["runs"]), 1)
            row["peak_rss_gb"] = round(max(float(row.get("peak_rss_gb") or 0), peak), 2)
            row["source"] = note
            rows[key] = row
            count += 1
        if count:
            self.measured_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.measured_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
            tmp.replace(self.measured_path)
            self.measured = rows
        return count
