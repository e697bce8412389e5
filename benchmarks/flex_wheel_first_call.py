"""The user's path: the attnforge-flex-kernels wheel installed into a fresh venv, its loader, the first call.

Packages built artifacts (``attnforge flex build`` output, or ``flex_first_call.py --build-only``'s
``build-bwd/artifacts``) into the wheel, installs it into a fresh venv over this machine's torch, then times
in fresh processes with empty compile caches: a cold first call (the same variant through
``torch.compile``, no wheel used) and ``import attnforge_flex; attention(name)(q, k, v)`` (+ backward when the
variant has it), loading included. Writes ``{"device", "torch", "wheel", "rows": [{"variant", "mode",
"cold_s", "wheel_s", "used", "max_err"}]}`` (``used``: what the loader ran: aoti, precompiled or compile).

    python benchmarks/flex_wheel_first_call.py --artifacts /tmp/fc/build-bwd/artifacts \\
        --out benchmarks/results/flex_wheel_first_call.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attnforge.flex.package import build_wheel  # noqa: E402
from attnforge.parity.venv import install, make_venv  # noqa: E402

CHILD = """
import json, sys, time
import torch
spec = json.loads(sys.argv[2])
dev = spec.get("device", "cuda")
from attnforge.flex.runtime import mods
q, k, v = mods.make_inputs(spec, dev, grad=bool(spec.get("backward")))
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
sync()
t0 = time.perf_counter()
if sys.argv[1] == "cold":
    fn = mods.FlexCall(spec, dev)
else:
    import attnforge_flex
    fn = attnforge_flex.attention(spec["name"])
out = fn(q, k, v)
if spec.get("backward"):
    out.backward(torch.ones_like(out))
sync()
dt = time.perf_counter() - t0
used = getattr(fn, "used", "compile")  # what the loader's call ran (a failed guard compiles); cold compiles
ref = mods.FlexCall(spec, dev, compiled=False)(q.detach(), k.detach(), v.detach())
print(json.dumps({"s": dt, "used": used, "max_err": float((out.detach().float() - ref.float()).abs().max())}))
"""


def timed(python: Path | str, mode: str, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """One first call in a fresh process with empty Inductor/Triton caches."""
    cache = Path(tempfile.mkdtemp(prefix=f"wfc-{mode}-", dir=work))
    env = dict(
        os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton")
    )
    # the child imports attnforge's runtime for the inputs and the reference (the wheel's loader is separate)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    p = subprocess.run(
        [str(python), "-c", CHILD, mode, json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if p.returncode != 0:
        return {"error": p.stderr[-1500:]}
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", type=Path, required=True, help="a built artifacts folder (manifest.json)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--only", action="append", default=[], help="variant names (default: all)")
    a = ap.parse_args(argv)
    work = a.work or Path(tempfile.mkdtemp(prefix="flex-wheel-first-call-"))
    work.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(a.artifacts, work / "dist")
    vpy = make_venv(work / "venv")
    install(vpy, [wheel])
    manifest = json.loads((a.artifacts / "manifest.json").read_text(encoding="utf-8"))
    import torch

    dev = manifest["env"].get("device", "cuda")
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__,
        "wheel": wheel.name,
        "rows": [],
        "command": "python benchmarks/flex_wheel_first_call.py " + " ".join(sys.argv[1:]),
    }
    for e in manifest["variants"]:
        spec = e["spec"]
        if (a.only and spec["name"] not in a.only) or not e.get("megacache"):
            continue
        cold = timed(sys.executable, "cold", spec, work)
        got = timed(vpy, "wheel", spec, work)
        row = {
            "variant": spec["name"],
            "mode": "fwd+bwd" if spec.get("backward") else "fwd",
            "cold_s": _s(cold),
            "wheel_s": _s(got),
            "used": got.get("used"),
            "max_err": got.get("max_err"),
            "errors": [r["error"] for r in (cold, got) if "error" in r],
        }
        res["rows"].append(row)
        print(json.dumps(row)[:800], flush=True)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return 0 if res["rows"] and all(r["wheel_s"] for r in res["rows"]) else 1


def _s(r: dict[str, Any]) -> float | None:
    return round(float(r["s"]), 3) if "s" in r else None


if __name__ == "__main__":
    sys.exit(main())
