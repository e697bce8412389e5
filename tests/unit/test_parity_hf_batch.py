"""The real-client test's batch, on CPU: with its labels, transformers' fp32 SDPA and fp32 eager models give
the same gradients. With the labels the H100 run used (the first real token of a padded row counted, predicted
from a padded position) they differed by 8% on the embedding gradient, which failed FA2 for a test bug."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from attnforge.parity.hf import padded_batch  # noqa: E402


def _embed_grad(
    cfg: object, impl: str, state: dict[str, torch.Tensor], batch: tuple[torch.Tensor, ...]
) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    ids, mask, labels = batch
    m = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    m.load_state_dict(state)
    m(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    return m.model.embed_tokens.weight.grad.detach().clone()


def test_fp32_implementations_agree_on_the_suite_batch() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    )
    state = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").state_dict()
    batch = padded_batch(cfg.vocab_size, 3, 97, "cpu")
    ids, mask, labels = batch
    assert (labels[mask == 0] == -100).all() and labels[1, 40] == -100 and labels[2, 3] == -100
    assert labels[1, 41] == ids[1, 41]
    eager, sdpa = (_embed_grad(cfg, impl, state, batch) for impl in ("eager", "sdpa"))
    assert float((sdpa - eager).norm() / eager.norm()) < 1e-4
