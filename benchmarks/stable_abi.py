"""The stable-ABI FA2 wheel against the per-torch wheel of the same kernels, in the same run on one GPU.

Each wheel is installed in its own folder (`pip install --no-deps --target DIR WHEEL`); every measurement runs
in a child process that sees one of them, children alternating (A B A B ...) so clock and thermal drift hit
both. Shapes: the attention benchmark's head-dim-128 shapes (forward and forward+backward, bf16, causal and
not) and a decode-like call (`flash_attn_with_kvcache`, one query token, 4,096 cached), where per-call
overhead (the dispatcher, the seed/offset draw) shows. Times are medians of triton.testing.do_bench over the
rounds' medians. Writes NAME.json with the rows and "ratios" (per-torch ms / stable ms: >= 1 means the
stable wheel is as fast or faster; the goal is every ratio >= 0.98).

    python benchmarks/stable_abi.py --stable DIR_A --per-torch DIR_B --out-dir benchmarks/results --name stable_abi_h100
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHAPES = [(8, 2048, 16, 128), (4, 8192, 16, 128)]  # benchmarks/attention.py's head-dim-128 shapes
DECODE = (16, 4096, 16, 128)  # batch, cached tokens, heads, head dim; one new query token


def child() -> None:
    """Measure every case with the flash_attn on sys.path; print one JSON object."""
    import flash_attn
    import torch
    from triton.testing import do_bench

    out: dict[str, float] = {}
    for b, s, h, d in SHAPES:
        q, k, v, go = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
        for causal in (False, True):

            def forward(q: Any = q, k: Any = k, v: Any = v, causal: bool = causal) -> None:
                flash_attn.flash_attn_func(q, k, v, causal=causal)

            def step(qg: Any = qg, kg: Any = kg, vg: Any = vg, go: Any = go, causal: bool = causal) -> None:
                o = flash_attn.flash_attn_func(qg, kg, vg, causal=causal)
                torch.autograd.grad(o, (qg, kg, vg), go)

            with torch.no_grad():
                out[f"fwd b{b} s{s} h{h} d{d} causal={causal}"] = float(
                    do_bench(forward, return_mode="median")
                )
            out[f"fwd+bwd b{b} s{s} h{h} d{d} causal={causal}"] = float(do_bench(step, return_mode="median"))
    b, cached, h, d = DECODE
    kc, vc = (torch.randn(b, cached + 16, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    qd = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), cached, dtype=torch.int32, device="cuda")
    with torch.no_grad():
        out[f"decode b{b} cache{cached} h{h} d{d}"] = float(
            do_bench(
                lambda: flash_attn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens, causal=True),
                return_mode="median",
            )
        )
    print(json.dumps({"flash_attn": flash_attn.__version__, "ms": out}))


def measure(site: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, __file__, "--child"], capture_output=True, text=True, env=env, check=True
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stable", type=Path, help="folder holding the installed stable-ABI wheel")
    ap.add_argument("--per-torch", type=Path, help="folder holding the installed per-torch wheel")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--name", default="stable_abi_h100")
    args = ap.parse_args()
    if args.child:
        child()
        return
    if not (args.stable and args.per_torch):
        ap.error("--stable and --per-torch are required")
    import torch

    runs: dict[str, list[dict[str, float]]] = {"stable": [], "per_torch": []}
    versions: dict[str, str] = {}
    for _ in range(args.rounds):
        for key, site in (("stable", args.stable), ("per_torch", args.per_torch)):
            got = measure(site)
            versions[key] = got["flash_attn"]
            runs[key].append(got["ms"])
    ms = {key: {case: statistics.median(r[case] for r in rs) for case in rs[0]} for key, rs in runs.items()}
    ratios = {case: round(ms["per_torch"][case] / ms["stable"][case], 4) for case in ms["stable"]}
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "wheels": versions,
        "ms": ms,
        "ratios": ratios,
        "min_ratio": min(ratios.values()),
        "goal": "every ratio (per-torch ms / stable ms) >= 0.98",
        "rounds": args.rounds,
    }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"min_ratio": result["min_ratio"], "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
