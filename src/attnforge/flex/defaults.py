"""The Flex variants `attnforge flex build --defaults` compiles (plain dicts; stdlib only)."""

from __future__ import annotations

from typing import Any

DEFAULT_VARIANTS: list[dict[str, Any]] = [
    {"name": "causal-bf16", "mask": "causal", "dtype": "bf16", "head_dim": 128, "heads_q": 16, "heads_kv": 16,
     "seq_len": 2048, "batch": 4},
    {"name": "swa-bf16", "mask": "sliding_window", "window": 256, "dtype": "bf16", "head_dim": 128,
     "heads_q": 16, "heads_kv": 16, "seq_len": 2048, "batch": 4},
    {"name": "document-bf16", "mask": "document", "dtype": "bf16", "head_dim": 128, "heads_q": 16,
     "heads_kv": 16, "seq_len": 2048, "batch": 4},
    {"name": "causal-gqa-softcap-bf16", "mask": "causal", "score_mod": "softcap", "softcap": 30.0,
     "dtype": "bf16", "head_dim": 128, "heads_q": 32, "heads_kv": 8, "seq_len": 2048, "batch": 2},
    {"name": "prefix-alibi-fp16", "mask": "prefix_lm", "prefix": 512, "score_mod": "alibi", "dtype": "fp16",
     "head_dim": 64, "heads_q": 16, "heads_kv": 16, "seq_len": 2048, "batch": 2},
    {"name": "cpu-causal-bf16", "mask": "causal", "dtype": "bf16", "head_dim": 64, "heads_q": 4, "heads_kv": 4,
     "seq_len": 256, "batch": 1, "backward": False, "device": "cpu"},
]  # fmt: skip
