"""Upstream: torch's compiled FlexAttention on an AVX2 CPU gives wrong rows (NaN in bf16) at some lengths.

Found through the Flex clients test: a 40-token call of a tiny Llama (head dim 16) that attnforge does not
serve goes to transformers' own ``flex_attention`` path, which compiles FlexAttention with Inductor's CPU
template, and returned NaN where eager attention is finite. It is not transformers' (5.17.0 and 5.24.0 alike)
nor attnforge's: plain ``torch.compile(flex_attention)`` does it. Seen with torch 2.13.0+cpu on an AVX2-only
x86 CPU (8 floats per vector).

Cause, in torch/_inductor/codegen/cpp_micro_gemm.py (``CppMicroGemmFP32Vec``, the ``q @ k.T`` micro-GEMM of
the CPU FlexAttention template, blocks of 16 keys): for a last key block of ``N`` keys with ``N % 8 == 0``
(N = 8) and a head dim ``K`` of 8 or 16, its ``ntail_transpose_b_kernel`` takes its "first
implementation", which sizes its vectors by ``BLOCK_N`` (16), not ``N``: it reads the 8 keys after the last
one and writes 8 scores past the query row. For the last row of a call with fewer than 128 tokens that is
past the score buffer, into the running max of rows 0-7, so rows 0-7 come out wrong (0, garbage or NaN,
depending on the memory after the keys). Affected: a length below 128 with ``length % 16 == 8`` and head
dim 8 or 16, any dtype.

These tests fail while the bug is there (``-m drift``; docs/flex.md, "Known upstream problems").
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.drift

UPSTREAM = (
    "torch's CPU FlexAttention template (Inductor, cpp_micro_gemm.py ntail_transpose_b_kernel: vectors sized "
    "by BLOCK_N, not N) writes past the scores for a last key block of 8 keys and head dim 8/16"
)


def _causal_block_mask(seq_len: int) -> Any:
    """A causal block mask over ``seq_len`` queries and keys on CPU (default 128-token blocks)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return q_idx >= kv_idx

    return create_block_mask(causal, None, None, seq_len, seq_len, device="cpu")


def _compiled_flex() -> Any:
    """``torch.compile(flex_attention)`` with static shapes, as a client compiles it."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def test_compiled_flex_attention_on_cpu_reads_no_key_past_the_last() -> None:
    """Deterministic: the keys' storage goes on past the last key with large scores for the last query.
    A correct kernel never reads them; the broken one zeroes rows 0-7."""
    b, h, s, d = 1, 1, 40, 16
    g = torch.Generator().manual_seed(0)
    q, v = (torch.randn(b, h, s, d, generator=g) for _ in range(2))
    q[..., -1, :] = 1.0
    storage = torch.full((b, h, s + 8, d), 100.0)
    storage[:, :, :s] = torch.randn(b, h, s, d, generator=g)
    k = storage[:, :, :s]
    out = _compiled_flex()(q, k, v, block_mask=_causal_block_mask(s))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    bad = ((out - ref).abs().amax(dim=(0, 1, 3)) > 1e-4).nonzero().flatten().tolist()
    assert bad == [], f"{UPSTREAM}: rows {bad} differ from SDPA (torch {torch.__version__})"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_flex_attention_on_cpu_bf16_40_tokens_head_dim_16(seed: int) -> None:
    """The Flex clients' Llama call (B2, 4 query and 2 key/value heads, 40 tokens, head dim 16, bf16,
    causal), plain contiguous tensors: finite and equal to SDPA."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 40, 16, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 2, 40, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    out = _compiled_flex()(q, k, v, block_mask=_causal_block_mask(40), enable_gqa=True).float()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True
    )
    err = float((out - ref).abs().max())
    assert bool(out.isfinite().all()) and err < 0.02, f"{UPSTREAM}: max err {err} (torch {torch.__version__})"


def test_transformers_llama_flex_attention_on_cpu_equals_eager() -> None:
    """What the clients test saw, without attnforge: a tiny random Llama (head dim 16) in bf16, 40 tokens,
    ``attn_implementation="flex_attention"`` against ``"eager"``."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(40))
    with torch.no_grad():
        model.set_attn_implementation("eager")
        ref = model(ids).logits.float()
        model.set_attn_implementation("flex_attention")
        got = model(ids).logits.float()
    err, scale = float((got - ref).abs().max()), float(ref.abs().max())
    assert err < 0.02 * scale, (
        f"{UPSTREAM}: Llama logits err {err} (scale {scale}; "
        f"transformers {transformers.__version__}, torch {torch.__version__})"
    )
