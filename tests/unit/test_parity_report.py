"""parity.json has exactly the contracted keys; Markdown and JUnit XML are written beside it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from attnforge.parity.parity_report import CASE_KEYS, FAILED, JSON_KEYS, PASSED, SKIPPED, Report, Result


def _report() -> Report:
    r = Report("NVIDIA H100 80GB HBM3", "2.11.0+cu130", "flash_attn-2.8.3+x.whl", "hd128")
    r.add(Result("flash_attn", "flash_attn_func[mha]:fwd", "bf16", "b2 sq113", PASSED, 0.002, 0.9))
    r.add(Result("flash_attn", "flash_attn_func[mha]:bwd", "bf16", "b2 sq113", SKIPPED, reason="no backward"))
    r.add(
        Result(
            "flex",
            "flex_attention[causal]:fwd",
            "bf16",
            "b2 s1021",
            FAILED,
            float("inf"),
            float("inf"),
            reason="out: max_err inf > bound",
        )
    )
    r.add(
        Result(
            "flash_attn",
            "flash_attn_func[mha]:fwd:expect-error",
            "bf16",
            "b1",
            PASSED,
            reason="raised as expected",
            details={"note": "built with head dims [128] only"},
        )
    )
    return r


def test_json_keys_exact_and_counts(tmp_path: Path) -> None:
    paths = _report().write(tmp_path)
    data = json.loads(paths["json"].read_text())
    assert tuple(data) == JSON_KEYS
    assert (data["passed"], data["failed"], data["skipped"]) == (2, 1, 1)
    # the keys first, in order; a failure adds its reason (and details when there are some)
    assert len(data["cases"]) == 3 and all(tuple(c)[: len(CASE_KEYS)] == CASE_KEYS for c in data["cases"])
    assert [set(c) - set(CASE_KEYS) <= {"reason", "details"} for c in data["cases"]] == [True] * 3
    assert "reason" in data["cases"][1] and "reason" not in data["cases"][0]
    assert data["cases"][1]["max_err"] == "inf" and data["cases"][2]["max_err"] is None


def test_markdown_and_junit(tmp_path: Path) -> None:
    rep = _report()
    paths = rep.write(tmp_path)
    md = paths["md"].read_text()
    assert "**FAILED**" in md and "no backward" in md and "| flex |" in md and "head dims [128]" in md
    root = ET.parse(paths["junit"]).getroot()
    suites = {s.get("name"): s for s in root}
    assert suites["flex"].get("failures") == "1" and suites["flash_attn"].get("skipped") == "1"
    assert not rep.passed
