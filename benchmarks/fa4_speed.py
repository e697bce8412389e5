"""FlashAttention-4 throughput against cuDNN and FA2 (both through SDPA) at the attention benchmark's shapes.

Forward and forward+backward TFLOP/s, bf16, the shapes and FLOP rule of ``benchmarks/attention.py`` (its
``SHAPES``, ``flops``, ``measure`` and SDPA implementations), medians of triton's do_bench, all in one
process. FA3 is measured when ``flash_attn_interface`` imports (``--fa3``); otherwise its row is absent.

    python benchmarks/fa4_speed.py --out speed.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attention
import torch


def run(with_fa3: bool) -> dict[str, Any]:
    import flash_attn.cute as fa4

    base = attention.impls(None, None)
    fns: dict[str, Any] = {
        "fa4": lambda q, k, v, c: fa4.flash_attn_func(q, k, v, causal=c)[0],
        "sdpa_cudnn": base["sdpa_cudnn"],
        "sdpa_flash": base["sdpa_flash"],
    }
    if with_fa3:
        try:
            import flash_attn_interface

            fns["fa3"] = lambda q, k, v, c: flash_attn_interface.flash_attn_func(q, k, v, causal=c)
        except ImportError as exc:
            print(f"fa3 not available: {exc}", flush=True)
    rows: list[dict[str, Any]] = []
    for b, s, h, d in attention.SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, go = (
            torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
        )
        for causal in (False, True):
            for pass_ in attention.PASSES:
                for name, fn in fns.items():
                    ms = attention.measure(fn, q, k, v, go, causal, pass_)
                    tf = attention.flops(b, s, h, d, causal, pass_) / ms / 1e9
                    rows.append(
                        {
                            "impl": name,
                            "causal": causal,
                            "pass": pass_,
                            "shape": f"b{b} s{s} h{h} d{d}",
                            "ms": round(ms, 4),
                            "tflops": round(tf, 1),
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
    ratios: dict[str, float] = {}
    for other in [n for n in fns if n != "fa4"]:
        for pass_ in attention.PASSES:
            r = [
                a["tflops"] / b_["tflops"]
                for a in rows
                for b_ in rows
                if a["impl"] == "fa4"
                and b_["impl"] == other
                and a["pass"] == b_["pass"] == pass_
                and a["shape"] == b_["shape"]
                and a["causal"] == b_["causal"]
            ]
            ratios[f"fa4_vs_{other}_{pass_}"] = round(statistics.median(r), 3)
    return {
        "rows": rows,
        "ratios": ratios,
        "ratio_rule": "median over shapes x causal of fa4 / other TFLOP/s",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--fa3", action="store_true")
    args = ap.parse_args()
    Path(args.out).write_text(json.dumps(run(args.fa3), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
