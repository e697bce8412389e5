"""Attention throughput on one GPU: the built flash-attn (FA2, impl "flash_attn") and FlashAttention-3 (impl
"fa3", `flash_attn_interface`) vs SDPA (flash, cuDNN) vs compiled FlexAttention.

Forward and forward+backward TFLOP/s (bf16) at B*S = 16k-32k tokens, H 16-32, D 64/128, causal and not.
FLOPs: forward 4*B*H*S^2*D (halved when causal); forward+backward 3.5x that (backward = 2.5x forward).
Times are medians of triton.testing.do_bench. Writes NAME.json ({"device", "rows": [{"impl", "causal", "pass",
"tflops", ...}], "fa2_vs_sdpa_flash_fwd" (geomean), "fa3_vs_cudnn_fwd", "fa3_vs_fa2_fwd" (medians over the
shapes x causal of the per-shape ratio; also for fwd+bwd), "command", ...}), NAME.png and NAME.md into --out-dir.

    python benchmarks/attention.py --out-dir benchmarks/results --name attention_h100
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

SHAPES = [  # (batch, seqlen, heads, head_dim): 16k and 32k tokens
    (8, 2048, 16, 128),
    (4, 8192, 16, 128),
    (8, 4096, 32, 64),
]
PASSES = ("fwd", "fwd+bwd")


def flops(b: int, s: int, h: int, d: int, causal: bool, pass_: str) -> float:
    f = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return f * (3.5 if pass_ == "fwd+bwd" else 1.0)


def bench(fn: Any, warmup: int = 10, rep: int = 50) -> float:
    """Median milliseconds (triton's do_bench, CUDA events)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def measure(fn: Any, q: Any, k: Any, v: Any, go: Any, causal: bool, pass_: str) -> float:
    """Median ms of one forward, or of forward + backward."""
    if pass_ == "fwd":
        with torch.no_grad():
            return bench(lambda: fn(q, k, v, causal))
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

    def step() -> None:
        o = fn(qg, kg, vg, causal)
        torch.autograd.grad(o, (qg, kg, vg), go)

    return bench(step)


def impls(fa_ok: Any, fa3: Any = None) -> dict[str, Any]:
    """name -> fn(q, k, v, causal) in (B, S, H, D) layout returning the output."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    sdpa = torch.nn.functional.scaled_dot_product_attention
    out: dict[str, Any] = {}
    if fa_ok is not None:
        out["flash_attn"] = lambda q, k, v, c: fa_ok.flash_attn_func(q, k, v, causal=c)
    if fa3 is not None:
        out["fa3"] = lambda q, k, v, c: fa3.flash_attn_func(q, k, v, causal=c)

    def sdpa_with(backend: Any) -> Any:
        def run(q: Any, k: Any, v: Any, c: bool) -> Any:
            with sdpa_kernel([backend]):
                return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=c).transpose(
                    1, 2
                )

        return run

    out["sdpa_flash"] = sdpa_with(SDPBackend.FLASH_ATTENTION)
    out["sdpa_cudnn"] = sdpa_with(SDPBackend.CUDNN_ATTENTION)
    # one static-shape graph per (shape, causal, grad): 3 shapes x 2 x 2 is past Dynamo's default recompile
    # limit (8), after which flex_attention silently ran eager (session 4: 4-8 TFLOP/s and an OOM at d64)
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
    flex_c = torch.compile(flex_attention, dynamic=False)
    masks: dict[tuple[int, bool], Any] = {}

    def causal_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return q >= kv

    def flex(q: Any, k: Any, v: Any, c: bool) -> Any:
        s = q.shape[1]
        if (s, c) not in masks:
            masks[(s, c)] = create_block_mask(causal_mod, None, None, s, s, device=q.device) if c else None
        return flex_c(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=masks[(s, c)]
        ).transpose(1, 2)

    out["flex_compiled"] = flex
    return out


def fa_profile(
    manifest: str | None, version: str, dist: str = "flash_attn", kernel: str = "flash-attn"
) -> Any:
    """The wheel's profile (head dims, dtypes): calling an excluded head dim must not take the run down."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from attnforge.parity.profile import resolve

    try:
        from importlib.metadata import version as dist_version

        version = dist_version(dist)
    except Exception:
        pass
    matrix = Path(__file__).resolve().parents[1] / "matrix.yaml"
    return resolve(Path(manifest) if manifest else None, version, matrix, kernel)


def run(args: argparse.Namespace) -> dict[str, Any]:
    fa = None
    fa_version = None
    fa3 = None
    fa3_version = None
    profs: dict[str, Any] = {}
    if not args.no_flash_attn:
        try:
            import flash_attn

            fa, fa_version = flash_attn, flash_attn.__version__
            profs["flash_attn"] = fa_profile(args.manifest, fa_version)
            print(f"flash_attn {fa_version}: {profs['flash_attn'].describe()}", flush=True)
        except Exception as exc:
            print(f"flash_attn not available: {exc}", flush=True)
    if not args.no_fa3:
        try:
            import flash_attn_interface

            fa3, fa3_version = flash_attn_interface, "?"
            profs["fa3"] = fa_profile(args.fa3_manifest, "", "flash_attn_3", "flash-attn-3")
            from importlib.metadata import version as dist_version

            fa3_version = dist_version("flash_attn_3")
            print(f"flash_attn_3 {fa3_version}: {profs['fa3'].describe()}", flush=True)
        except Exception as exc:
            print(f"flash_attn_interface (FA3) not available: {exc}", flush=True)
    fns = impls(fa, fa3)
    if args.impls:
        fns = {k: v for k, v in fns.items() if k in args.impls.split(",")}
    rows: list[dict[str, Any]] = []
    for b, s, h, d in SHAPES[: args.shapes]:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, go = (
            torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
        )
        for causal in (False, True):
            for name, fn in fns.items():
                for pass_ in PASSES:
                    shape = f"b{b} s{s} h{h} d{d}"
                    prof = profs.get(name)
                    if prof is not None and (d not in prof.head_dims or "bf16" not in prof.dtypes):
                        rows.append(
                            {
                                "impl": name,
                                "causal": causal,
                                "pass": pass_,
                                "tflops": None,
                                "shape": shape,
                                "error": f"not in the wheel's profile ({prof.describe()})",
                            }
                        )
                        continue
                    try:
                        ms = measure(fn, q, k, v, go, causal, pass_)
                        tf = flops(b, s, h, d, causal, pass_) / (ms * 1e-3) / 1e12
                        rows.append(
                            {
                                "impl": name,
                                "causal": causal,
                                "pass": pass_,
                                "tflops": round(tf, 1),
                                "shape": shape,
                                "ms": round(ms, 4),
                            }
                        )
                        print(
                            f"{name:14s} {shape:22s} causal={causal!s:5s} {pass_:8s} {ms:8.3f} ms {tf:7.1f} TFLOP/s",
                            flush=True,
                        )
                    except Exception as exc:
                        msg = str(exc).strip().splitlines()
                        rows.append(
                            {
                                "impl": name,
                                "causal": causal,
                                "pass": pass_,
                                "tflops": None,
                                "shape": shape,
                                "error": f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300],
                            }
                        )
                        print(f"{name} {shape} causal={causal} {pass_}: {rows[-1]['error']}", flush=True)
        torch.cuda.empty_cache()
    return {
        "device": torch.cuda.get_device_name(),
        "rows": rows,
        "fa2_vs_sdpa_flash_fwd": ratio(rows, "flash_attn", "sdpa_flash", "fwd"),
        "fa3_vs_cudnn_fwd": median_ratio(rows, "fa3", "sdpa_cudnn", "fwd"),
        "fa3_vs_fa2_fwd": median_ratio(rows, "fa3", "flash_attn", "fwd"),
        "fa3_vs_cudnn_fwdbwd": median_ratio(rows, "fa3", "sdpa_cudnn", "fwd+bwd"),
        "fa3_vs_fa2_fwdbwd": median_ratio(rows, "fa3", "flash_attn", "fwd+bwd"),
        "ratio_rule": "fa2_vs_sdpa_flash_fwd: geometric mean; fa3_vs_*: median over (shape, causal) of the ratio",
        "command": args.command,
        "torch": torch.__version__,
        "flash_attn": fa_version,
        "flash_attn_3": fa3_version,
        "dtype": "bf16",
        "flops_rule": "fwd 4*B*H*S^2*D (x0.5 causal); fwd+bwd x3.5",
        "timing": "triton.testing.do_bench median, warmup 10 ms, rep 50 ms",
    }


def ratios(rows: list[dict[str, Any]], a: str, b: str, pass_: str) -> list[float]:
    """a's TFLOP/s over b's for every (shape, causal) both measured."""
    vals = []
    for r in rows:
        if r["impl"] != a or r["pass"] != pass_ or not r.get("tflops"):
            continue
        other = next(
            (
                x
                for x in rows
                if x["impl"] == b
                and x["pass"] == pass_
                and x["causal"] == r["causal"]
                and x["shape"] == r["shape"]
                and x.get("tflops")
            ),
            None,
        )
        if other:
            vals.append(r["tflops"] / other["tflops"])
    return vals


def ratio(rows: list[dict[str, Any]], a: str, b: str, pass_: str) -> float | None:
    """Geometric mean over (shape, causal) of a's TFLOP/s over b's."""
    vals = ratios(rows, a, b, pass_)
    return round(math.exp(sum(map(math.log, vals)) / len(vals)), 3) if vals else None


def median_ratio(rows: list[dict[str, Any]], a: str, b: str, pass_: str) -> float | None:
    """Median over (shape, causal) of a's TFLOP/s over b's."""
    vals = ratios(rows, a, b, pass_)
    return round(statistics.median(vals), 3) if vals else None


def markdown(res: dict[str, Any]) -> str:
    impl_names = list(dict.fromkeys(r["impl"] for r in res["rows"]))
    lines = [
        f"# Attention TFLOP/s on {res['device']}",
        "",
        f"torch {res['torch']}, flash_attn {res['flash_attn'] or '-'}, bf16. {res['flops_rule']}; "
        f"{res['timing']}.",
        "",
        f"flash_attn / SDPA flash, forward (geomean): "
        f"**{res['fa2_vs_sdpa_flash_fwd'] if res['fa2_vs_sdpa_flash_fwd'] is not None else '-'}**",
        "",
        f"FA3 ({res.get('flash_attn_3') or '-'}) / cuDNN, forward (median): **{res.get('fa3_vs_cudnn_fwd') or '-'}**; "
        f"FA3 / flash_attn (FA2), forward (median): **{res.get('fa3_vs_fa2_fwd') or '-'}**",
        "",
        f"Command: `{res['command']}`",
        "",
        "| shape | causal | pass | " + " | ".join(impl_names) + " |",
        "|---|---|---|" + "---:|" * len(impl_names),
    ]
    keys = list(dict.fromkeys((r["shape"], r["causal"], r["pass"]) for r in res["rows"]))
    for shape, causal, pass_ in keys:
        cells = []
        for n in impl_names:
            r = next(
                (
                    x
                    for x in res["rows"]
                    if (x["shape"], x["causal"], x["pass"], x["impl"]) == (shape, causal, pass_, n)
                ),
                None,
            )
            cells.append("-" if r is None or r.get("tflops") is None else f"{r['tflops']:.0f}")
        lines.append(f"| {shape} | {'yes' if causal else 'no'} | {pass_} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        print(f"no plot: matplotlib unavailable ({exc})")
        return False
    impl_names = list(dict.fromkeys(r["impl"] for r in res["rows"]))
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=False)
    for ax, pass_ in zip(axes, PASSES, strict=True):
        keys = list(dict.fromkeys((r["shape"], r["causal"]) for r in res["rows"] if r["pass"] == pass_))
        width = 0.8 / max(1, len(impl_names))
        for i, n in enumerate(impl_names):
            vals = []
            for shape, causal in keys:
                r = next(
                    (
                        x
                        for x in res["rows"]
                        if (x["shape"], x["causal"], x["pass"], x["impl"]) == (shape, causal, pass_, n)
                    ),
                    None,
                )
                vals.append(r["tflops"] if r and r.get("tflops") else 0.0)
            ax.bar([j + i * width for j in range(len(keys))], vals, width, label=n)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))])
        ax.set_xticklabels([f"{s}\n{'causal' if c else 'full'}" for s, c in keys], fontsize=7)
        ax.set_title(f"{pass_} (bf16)")
        ax.set_ylabel("TFLOP/s")
        ax.legend(fontsize=8)
    fig.suptitle(f"{res['device']}: torch {res['torch']}, flash_attn {res['flash_attn'] or '-'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--name", default="attention_h100")
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="use the first N shapes")
    ap.add_argument("--impls", default="", help="comma list to keep (default all)")
    ap.add_argument("--no-flash-attn", action="store_true")
    ap.add_argument("--manifest", help="the flash-attn wheel's manifest (its head dims and dtypes)")
    ap.add_argument("--no-fa3", action="store_true", help="leave FlashAttention-3 out even when installed")
    ap.add_argument("--fa3-manifest", help="the flash-attn-3 wheel's manifest (its head dims and dtypes)")
    args = ap.parse_args(argv)
    args.command = "python " + " ".join(
        shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]
    )
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 5
    t0 = time.perf_counter()
    res = run(args)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    (out / f"{args.name}.md").write_text(markdown(res), encoding="utf-8")
    plot(res, out / f"{args.name}.png")
    print(markdown(res))
    print(
        f"attention benchmark: {len(res['rows'])} rows in {time.perf_counter() - t0:.0f} s -> {out}/{args.name}.*"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
