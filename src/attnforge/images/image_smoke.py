"""Run the in-image smoke test (`smoke_script.py`, copied to /opt/attnforge/smoke.py) and read its report;
the expectations come from the build request or from an image's own labels."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any

from attnforge.core.docker_cli import Docker

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def engine_has_gpu(dk: Docker) -> bool:
    """nvidia-smi on the host and an nvidia runtime in the engine."""
    if shutil.which("nvidia-smi") is None:
        return False
    res = dk.run("info", "--format", "{{json .Runtimes}}")
    return res.ok and "nvidia" in res.output


def run_smoke(
    dk: Docker, ref: str, expect: dict[str, str], *, gpu: bool, log: Log = _quiet
) -> dict[str, Any]:
    """Run the in-image smoke test; the parsed report (ok False with the output tail when it broke)."""
    args = ["run", "--rm", "--network", "none"]
    if gpu:
        args += ["--gpus", "all"]
    args += [ref, "python", "/opt/attnforge/smoke.py", "--expect", json.dumps(expect, sort_keys=True)]
    res = dk.run(*args)
    for line in res.output.splitlines():
        if line.startswith(("ok ", "FAIL ")):
            log(f"  smoke {line}")
    report: dict[str, Any] = {"ok": False, "output": res.tail(20)}
    for line in reversed(res.output.splitlines()):
        if line.startswith("@@attnforge-smoke "):
            report = json.loads(line[len("@@attnforge-smoke ") :])
            break
    report["exit_code"] = res.returncode
    report["ok"] = bool(report.get("ok")) and res.returncode == 0
    return report


def expect_from_labels(labels: dict[str, str]) -> dict[str, str]:
    """What the smoke test should find in an image, from the image's own labels."""
    p = "io.attnforge."
    expect = {
        "torch": labels.get(p + "torch", ""),
        "flash_attn": labels.get(p + "flash-attn", ""),
        "kind": labels.get(p + "kind", ""),
    }
    policy = labels.get(p + "ngc.flash-attn-policy")
    if policy:
        expect["policy"] = policy
        expect["bundled"] = labels.get(p + "ngc.bundled-flash-attn", "")
    return {k: v for k, v in expect.items() if v}
