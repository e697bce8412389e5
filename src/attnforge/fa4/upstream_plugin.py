"""The pytest plugin that samples FlashAttention-4's own tests (``tests/cute/``): copied as ``conftest.py``
beside the test files (upstream's own conftest is renamed ``upstream_conftest.py`` and loaded from here).

Its instructions come in ``ATTNFORGE_FA4_UPSTREAM`` (JSON): ``tests`` (test function -> parameter name -> the
values the declarations cover; a parameter not named is not restricted), ``n`` (cases drawn per test function,
fixed ``seed``) and ``out`` (the report: the keys of attnforge's ``parity.json``: device, torch, wheel,
profile, passed, failed, skipped, cases). Standard library, pytest and torch only.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

with contextlib.suppress(ImportError):  # upstream's own conftest (per-worker GPU pinning, logging), kept
    from upstream_conftest import *  # noqa: F403

_RESULTS: dict[str, dict[str, Any]] = {}
_COUNTS: dict[str, int] = {}


def _spec() -> dict[str, Any]:
    return dict(json.loads(os.environ["ATTNFORGE_FA4_UPSTREAM"]))


def _value(v: Any) -> Any:
    s = str(v)
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(s, v)


def _keep(item: Any, spec: dict[str, Any]) -> bool:
    name = getattr(item, "originalname", None) or item.name.split("[")[0]
    allowed = spec["tests"].get(name)
    if allowed is None:
        return False
    params = getattr(getattr(item, "callspec", None), "params", {})
    return all(_value(params.get(k)) in vals for k, vals in allowed.items() if k in params)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    spec = _spec()
    eligible = [it for it in items if _keep(it, spec)]
    rng = random.Random(int(spec.get("seed", 0)))
    chosen: list[Any] = []
    for test in spec["tests"]:
        group = [
            it for it in eligible if (getattr(it, "originalname", None) or it.name.split("[")[0]) == test
        ]
        chosen += rng.sample(group, min(int(spec["n"]), len(group))) if group else []
    keep = {id(it) for it in chosen}
    config.hook.pytest_deselected(items=[it for it in items if id(it) not in keep])
    _COUNTS.update(collected=len(items), eligible=len(eligible), sampled=len(chosen))
    items[:] = [it for it in items if id(it) in keep]


def pytest_runtest_logreport(report: Any) -> None:
    r = _RESULTS.setdefault(report.nodeid, {"outcome": "passed"})
    if report.skipped:
        r["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.failed:
        r["outcome"] = "failed"
        r["message"] = str(report.longrepr)[-400:]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    import torch

    spec = _spec()
    cases = []
    for nodeid, r in sorted(_RESULTS.items()):
        case = {
            "kernel": "fa4-upstream:" + nodeid.split("::", 1)[-1],
            "dtype": "bf16" if "bfloat16" in nodeid or "dtype0" in nodeid else "",
            "shape": "",
            "max_err": None,
            "ratio_vs_torch": None,
            "ok": r["outcome"] in ("passed", "skipped", "xfailed"),
            "outcome": r["outcome"],
        }
        if "message" in r:
            case["message"] = r["message"]
        cases.append(case)
    props = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability()
    report = {
        "device": f"{props.name} (sm_{major}{minor}, {props.total_memory // 2**30} GiB)",
        "torch": torch.__version__,
        "wheel": spec.get("wheel", ""),
        "profile": spec.get("profile", ""),
        "passed": sum(c["outcome"] == "passed" for c in cases),
        "failed": sum(c["outcome"] == "failed" for c in cases),
        "skipped": sum(c["outcome"] in ("skipped", "xfailed") for c in cases),
        "cases": cases,
        "sample": {**_COUNTS, "n_per_test": spec["n"], "seed": spec.get("seed", 0), "tests": spec["tests"]},
    }
    Path(spec["out"]).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
