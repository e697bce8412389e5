"""A real FA4 caller: a Hugging Face transformers Llama (random weights, GQA 8/2, head dim 128, bf16) with
``attn_implementation="flash_attention_4"``: the first training step (forward + backward) in this fresh
process, timed, and the FA4 cache entries it compiled (none when the attnforge wheel served every kernel).

    python benchmarks/fa4_hf_client.py --seq 512 --batch 1     # one '@@fa4 {json}' line
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    import torch
    import transformers

    t0 = time.perf_counter()
    from flash_attn.cute import cache_utils

    root = Path(cache_utils.get_cache_path())
    before = {p for p in root.rglob("*.o")}
    cfg = transformers.LlamaConfig(
        hidden_size=1024,
        intermediate_size=2048,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        vocab_size=1000,
        max_position_embeddings=4096,
    )
    model: Any = transformers.LlamaForCausalLM(cfg)
    model = model.to("cuda", torch.bfloat16)
    model.set_attn_implementation("flash_attention_4")
    ids = torch.randint(0, 1000, (args.batch, args.seq), device="cuda")
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    first = time.perf_counter() - t1
    t2 = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    second = time.perf_counter() - t2
    compiled = sorted(str(p.relative_to(root)) for p in set(root.rglob("*.o")) - before)
    hook = sys.modules["attnforge_fa4"].stats() if "attnforge_fa4" in sys.modules else {}
    print(
        "@@fa4 "
        + json.dumps(
            {
                "client": f"transformers {transformers.__version__} LlamaForCausalLM, attn_implementation=flash_attention_4",
                "shape": f"B{args.batch} S{args.seq} H8/2 D128 bf16 causal fwd+bwd",
                "setup_s": round(t1 - t0, 3),
                "first_step_s": round(first, 4),
                "second_step_s": round(second, 4),
                "compiled_entries": len(compiled),
                "hook": hook,
                "persistent_cache": os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
