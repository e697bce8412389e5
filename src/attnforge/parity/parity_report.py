"""Parity results: ``parity.json`` (exact keys below), ``parity.md`` and JUnit XML. Standard library only.

``parity.json``::

    {"device", "torch", "wheel", "profile", "python", "wheel_sha256", "passed", "failed", "skipped",
     "cases": [{"kernel", "dtype", "shape", "max_err", "ratio_vs_torch", "ok"}, ...]}

``cases`` holds every case that ran (skipped ones are counted, with their reasons in the Markdown and
the JUnit XML). ``max_err`` and ``ratio_vs_torch`` are null for an expected-error case.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
JSON_KEYS = (
    "device",
    "torch",
    "wheel",
    "profile",
    "python",
    "wheel_sha256",
    "passed",
    "failed",
    "skipped",
    "cases",
)
CASE_KEYS = ("kernel", "dtype", "shape", "max_err", "ratio_vs_torch", "ok")


@dataclass
class Result:
    """One case's outcome. ``suite`` groups cases (flash_attn, flex, sdpa, hf) in the reports."""

    suite: str
    kernel: str
    dtype: str
    shape: str
    status: str
    max_err: float | None = None
    ratio_vs_torch: float | None = None
    reason: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == PASSED

    @property
    def name(self) -> str:
        return f"{self.kernel} {self.dtype} {self.shape}"

    def case_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "dtype": self.dtype,
            "shape": self.shape,
            "max_err": _num(self.max_err),
            "ratio_vs_torch": _num(self.ratio_vs_torch),
            "ok": self.ok,
        }

    def report_json(self) -> dict[str, Any]:
        """``case_json`` plus, where there is one, the reason and (failures, real clients) the details."""
        out = self.case_json()
        if self.reason:
            out["reason"] = self.reason
        if self.details and (not self.ok or self.suite == "hf"):
            out["details"] = self.details
        return out


def _num(x: float | None) -> float | str | None:
    if x is None:
        return None
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return float(f"{x:.4g}")


@dataclass
class Report:
    """Everything a parity run produced, plus where it ran."""

    device: str
    torch: str
    wheel: str | None
    profile: str | None
    results: list[Result] = field(default_factory=list)
    wheel_sha256: str | None = None
    python: str = field(default_factory=lambda: f"cp{sys.version_info[0]}{sys.version_info[1]}")

    def add(self, r: Result) -> Result:
        self.results.append(r)
        return r

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def passed(self) -> bool:
        """No failure and at least one case ran."""
        return self.count(FAILED) == 0 and self.count(PASSED) > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "torch": self.torch,
            "wheel": self.wheel,
            "profile": self.profile,
            "python": self.python,
            "wheel_sha256": self.wheel_sha256,
            "passed": self.count(PASSED),
            "failed": self.count(FAILED),
            "skipped": self.count(SKIPPED),
            "cases": [r.report_json() for r in self.results if r.status != SKIPPED],
        }

    def write(self, out_dir: Path, stem: str = "parity") -> dict[str, Path]:
        """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.junit.xml`` into ``out_dir``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = {
            "json": out_dir / f"{stem}.json",
            "md": out_dir / f"{stem}.md",
            "junit": out_dir / f"{stem}.junit.xml",
        }
        paths["json"].write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        paths["md"].write_text(self.markdown(), encoding="utf-8")
        paths["junit"].write_bytes(self.junit())
        return paths

    def markdown(self) -> str:
        """A human summary: totals, per-suite table, worst ratios, failures and skip reasons."""
        lines = [
            "# GPU parity",
            "",
            f"- device: {self.device}",
            f"- torch: {self.torch}",
            f"- wheel: {self.wheel or '-'}",
            f"- profile: {self.profile or '-'}",
            f"- python: {platform.python_version()}",
            f"- result: **{'PASSED' if self.passed else 'FAILED'}**: {self.count(PASSED)} passed, "
            f"{self.count(FAILED)} failed, {self.count(SKIPPED)} skipped",
            "",
            "Rule (upstream flash-attn's): max |kernel - fp32 ref| <= 2x (forward) or 3x (gradients) "
            "max |PyTorch low-precision - fp32 ref| + the reference's own rounding error. "
            "`ratio` = kernel error / PyTorch error.",
            "",
            "| suite | passed | failed | skipped | worst ratio | median ratio |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        suites = sorted({r.suite for r in self.results})
        for s in suites:
            rs = [r for r in self.results if r.suite == s]
            ratios = sorted(r.ratio_vs_torch for r in rs if r.ratio_vs_torch is not None)
            worst = f"{ratios[-1]:.3g}" if ratios else "-"
            med = f"{ratios[len(ratios) // 2]:.3g}" if ratios else "-"
            n = {st: sum(1 for r in rs if r.status == st) for st in (PASSED, FAILED, SKIPPED)}
            lines.append(f"| {s} | {n[PASSED]} | {n[FAILED]} | {n[SKIPPED]} | {worst} | {med} |")
        failed = [r for r in self.results if r.status == FAILED]
        if failed:
            lines += ["", "## Failures", "", "| case | max_err | ratio | why |", "|---|---:|---:|---|"]
            for r in failed:
                lines.append(
                    f"| `{r.name}` | {_fmt(r.max_err)} | {_fmt(r.ratio_vs_torch)} | {_md(r.reason)} |"
                )
        ranked = sorted(
            (r for r in self.results if r.ratio_vs_torch is not None and r.status != SKIPPED),
            key=lambda r: -(r.ratio_vs_torch or 0.0),
        )[:15]
        if ranked:
            lines += [
                "",
                "## Highest ratios",
                "",
                "| suite | case | max_err | ratio | ok |",
                "|---|---|---:|---:|---|",
            ]
            for r in ranked:
                lines.append(
                    f"| {r.suite} | `{r.name}` | {_fmt(r.max_err)} | {_fmt(r.ratio_vs_torch)} | "
                    f"{'yes' if r.ok else 'NO'} |"
                )
        skipped: dict[str, int] = {}
        for r in self.results:
            if r.status == SKIPPED:
                skipped[f"{r.suite}: {r.reason}"] = skipped.get(f"{r.suite}: {r.reason}", 0) + 1
        if skipped:
            lines += ["", "## Skipped", "", "| reason | cases |", "|---|---:|"]
            lines += [f"| {_md(k)} | {v} |" for k, v in sorted(skipped.items())]
        notes = [r for r in self.results if r.details.get("note")]
        if notes:
            lines += ["", "## Notes", ""]
            lines += [f"- `{r.name}`: {_md(str(r.details['note']))}" for r in notes]
        return "\n".join(lines) + "\n"

    def junit(self) -> bytes:
        """JUnit XML, one testsuite per suite."""
        root = ET.Element("testsuites", name="attnforge-gpu-parity")
        for s in sorted({r.suite for r in self.results}):
            rs = [r for r in self.results if r.suite == s]
            ts = ET.SubElement(
                root,
                "testsuite",
                name=s,
                tests=str(len(rs)),
                failures=str(sum(r.status == FAILED for r in rs)),
                skipped=str(sum(r.status == SKIPPED for r in rs)),
                time=f"{sum(r.seconds for r in rs):.3f}",
            )
            for r in rs:
                tc = ET.SubElement(
                    ts, "testcase", classname=f"parity.{s}", name=r.name, time=f"{r.seconds:.3f}"
                )
                if r.status == FAILED:
                    fail = ET.SubElement(tc, "failure", message=r.reason[:500] or "failed")
                    fail.text = json.dumps(r.case_json() | {"details": r.details}, default=str)
                elif r.status == SKIPPED:
                    ET.SubElement(tc, "skipped", message=r.reason[:500])
                elif r.details:
                    out = ET.SubElement(tc, "system-out")
                    out.text = json.dumps(r.details, default=str)
        return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]
