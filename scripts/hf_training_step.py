"""A transformers training run through two FA2 wheels (and SDPA): does the stable-ABI wheel train like the per-torch one?

A small Llama (head dim 128, grouped-query attention, random weights, no download) learns a copy task (each
sequence is 256 random tokens twice: the second half is predictable only by attending back) for a few steps with
``attn_implementation="flash_attention_2"`` and ``attention_dropout`` > 0, once with each wheel (each installed in
its own folder with ``pip install --no-deps --target DIR``) and once with SDPA, each in its own process, from the
same initial weights and batches. Dropout masks come from each implementation's own random stream, so the
losses are compared as runs (mean over the steps, and step by step), not bit for bit; the stable wheel's gap to
the per-torch wheel may be up to twice SDPA's gap to it (or ``--tolerance``); with ``--dropout 0`` the two
wheels run the same kernels and must agree closely. Writes one JSON object.

    python scripts/hf_training_step.py --stable DIR_A --per-torch DIR_B --dropout 0.1 --out result.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


def child(impl: str, dropout: float, steps: int) -> dict[str, Any]:
    """Train the small model; return its losses (flash_attn comes from sys.path, set by the parent)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=1024,
        attention_dropout=dropout,
    )
    torch.manual_seed(0)  # the same initial weights for every implementation
    model = (
        AutoModelForCausalLM.from_config(config, attn_implementation=impl).to("cuda", torch.bfloat16).train()
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator(device="cpu").manual_seed(1)
    losses = []
    for _ in range(steps):
        half = torch.randint(0, config.vocab_size, (8, 256), generator=data)
        ids = torch.cat([half, half], dim=1).cuda()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    import flash_attn

    return {"impl": impl, "losses": losses, "flash_attn": getattr(flash_attn, "__file__", None)}


def run(folder: Path | None, impl: str, dropout: float, steps: int) -> dict[str, Any]:
    """One training run in a fresh process that sees the flash_attn in ``folder`` first."""
    code = (
        "import sys, json; "
        + (f"sys.path.insert(0, {str(folder)!r}); " if folder else "")
        + f"sys.path.insert(0, {str(Path(__file__).parent)!r}); import hf_training_step as h; "
        + f"print(json.dumps(h.child({impl!r}, {dropout!r}, {steps!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stable", type=Path, required=True, help="folder holding the stable-ABI wheel")
    ap.add_argument("--per-torch", type=Path, required=True, help="folder holding the per-torch wheel")
    ap.add_argument("--dropout", type=float, default=0.1, help="the model's attention_dropout")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--tolerance", type=float, default=0.02, help="largest relative gap of the mean losses")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = {
        "stable": run(args.stable, "flash_attention_2", args.dropout, args.steps),
        "per_torch": run(args.per_torch, "flash_attention_2", args.dropout, args.steps),
        "sdpa": run(args.per_torch, "sdpa", args.dropout, args.steps),
    }
    mean = {k: statistics.fmean(v["losses"]) for k, v in runs.items()}
    gap = abs(mean["stable"] - mean["per_torch"]) / mean["per_torch"]
    # two correct implementations with their own dropout masks (SDPA and the per-torch wheel) differ too: the
    # stable wheel may differ from the per-torch one by up to twice that, or by the tolerance if larger
    reference_gap = abs(mean["sdpa"] - mean["per_torch"]) / mean["per_torch"]
    allowed = max(args.tolerance, 2 * reference_gap)
    steps = [abs(a - b) for a, b in zip(runs["stable"]["losses"], runs["per_torch"]["losses"], strict=True)]
    result = {
        "dropout": args.dropout,
        "steps": args.steps,
        "mean_loss": mean,
        "relative_gap_stable_vs_per_torch": gap,
        "relative_gap_sdpa_vs_per_torch": reference_gap,
        "allowed_gap": allowed,
        "max_step_gap": max(steps),
        "first_loss": {k: v["losses"][0] for k, v in runs.items()},
        "loss_after_half": {k: v["losses"][len(v["losses"]) // 2] for k, v in runs.items()},
        "last_loss": {k: v["losses"][-1] for k, v in runs.items()},
        "tolerance": args.tolerance,
        "passed": gap <= allowed,
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {k: result[k] for k in ("dropout", "mean_loss", "relative_gap_stable_vs_per_torch", "passed")}
        )
    )
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
