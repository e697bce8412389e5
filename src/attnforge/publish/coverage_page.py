"""The coverage page writer of an index: every generation, whether a publish or a yank made it, gets
`index.html` (`coverage_html`) and `coverage.json` (the plan snapshot and the grid as data) at its root.

`CoveragePage` is the `root_page` of a `StaticIndex`; the grid it shows comes from `coverage.build_sections`.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from attnforge.builder.files import atomic_write_bytes
from attnforge.publish.coverage import COVERAGE_JSON, build_sections, summary
from attnforge.publish.coverage_html import render_page
from attnforge.publish.coverage_plan import PlanSnapshot
from attnforge.publish.index import ALL, FileRecord
from attnforge.wheels.records import TORCH_CHECKS_SUFFIX
from attnforge.wheels.torch_checks import parse_checks


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_plan(generation: Path | None) -> PlanSnapshot | None:
    """The plan snapshot a generation's coverage.json holds (None when it has none)."""
    if generation is None:
        return None
    data = _read_json(generation / COVERAGE_JSON).get("plan")
    return PlanSnapshot.from_json(data) if isinstance(data, dict) else None


class CoveragePage:
    """The root page writer of an index: the coverage page and its data, from the records and a plan.

    `plan` None keeps the plan of the generation being replaced (a yank, a publish without a matrix).
    """

    def __init__(self, plan: PlanSnapshot | None = None) -> None:
        self.plan = plan

    def __call__(self, gen: Path, previous: Path | None, records: dict[str, FileRecord]) -> None:
        plan = self.plan if self.plan is not None else load_plan(previous)
        manifests = {
            f: _read_json(gen / r.variant / "simple" / r.project / (f + ".manifest.json"))
            for f, r in records.items()
        }
        checks = {
            f: parse_checks(
                _read_json(gen / r.variant / "simple" / r.project / (f + TORCH_CHECKS_SUFFIX)), r.sha256
            )
            for f, r in records.items()
        }
        sections = build_sections(records, manifests, plan, checks)
        generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        variants = sorted({r.variant for r in records.values()})
        page = render_page(sections, [ALL, *variants], generated, plan.notes if plan else [])
        atomic_write_bytes(gen / "index.html", page.encode("utf-8"))
        data = {
            "schema": 1,
            "generated": generated,
            "plan": plan.to_json() if plan else None,
            "summary": summary(sections),
            "sections": [asdict(s) for s in sections],
        }
        atomic_write_bytes(
            gen / COVERAGE_JSON, (json.dumps(data, separators=(",", ":")) + "\n").encode("utf-8")
        )
