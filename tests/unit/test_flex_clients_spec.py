"""Flex variants declared from a client's point of view (matrix.yaml `flex.clients`): expansion and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge.core.errors import ConfigurationError
from attnforge.flex.flex_spec import FlexVariant, load_variants, parse_variants

LLAMA = {"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512, "torch_dtype": "bfloat16"}


def _one(**decl: object) -> list[dict]:
    return [v.as_dict() for v in parse_variants({"clients": [{"name": "m", **decl}]})]


def test_transformers_config_expands_to_one_variant_per_batch_and_length() -> None:
    vs = _one(
        client="transformers", config=LLAMA, buckets=[256, 512], seq_lens=[100], batches=[4, 1], training=True
    )
    names = [v["name"] for v in vs]
    assert names == ["m-b1-s100", "m-b1-s256", "m-b1-s512", "m-b4-s100", "m-b4-s256", "m-b4-s512"]
    v = vs[1]
    assert (v["heads_q"], v["heads_kv"], v["head_dim"], v["dtype"], v["mask"]) == (8, 2, 64, "bf16", "causal")
    assert (v["client"], v["group"], v["backward"], v["device"]) == ("transformers", "m", True, "cuda")
    # an exact length serves itself; each bucket the lengths above the previous bucket
    assert [(x["seq_len"], x["pad_from"]) for x in vs[:3]] == [(100, 100), (256, 1), (512, 257)]


def test_gemma_like_config_gives_causal_and_sliding_kinds_with_softcap_and_scale() -> None:
    cfg = {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_size": 2304,
        "dtype": "bfloat16",
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "query_pre_attn_scalar": 256,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    vs = _one(client="transformers", config=cfg, seq_lens=[1024])
    assert [v["name"] for v in vs] == ["m-causal-b1-s1024", "m-sliding-b1-s1024"]
    full, swa = vs
    assert full["mask"] == "causal" and swa["mask"] == "sliding_window"
    assert swa["window"] == 4095  # transformers' window counts the query itself
    assert full["score_mod"] == "softcap" and full["softcap"] == 50.0
    assert full["scale"] == pytest.approx(256**-0.5) and full["head_dim"] == 256


@pytest.mark.parametrize(
    ("extra", "mask", "window"),
    [
        ({"sliding_window": 4096, "use_sliding_window": False}, "causal", None),  # Qwen2's default
        ({"sliding_window": 4096}, "sliding_window", 4095),  # Mistral
        ({"is_causal": False}, "full", None),  # an encoder
    ],
)
def test_mask_kind_follows_the_config(extra: dict, mask: str, window: int | None) -> None:
    [v] = _one(client="transformers", config=LLAMA | extra, seq_lens=[64])
    assert (v["mask"], v["window"]) == (mask, window)


def test_diffusers_transformer_config_is_full_attention_with_exact_lengths() -> None:
    vs = _one(
        client="diffusers",
        config={"num_attention_heads": 24, "attention_head_dim": 128},
        seq_lens=[4352, 4608],
        dtype="fp16",
    )
    assert [
        (v["mask"], v["heads_q"], v["head_dim"], v["dtype"], v["seq_len"], v["pad_from"]) for v in vs
    ] == [
        ("full", 24, 128, "fp16", 4352, 4352),
        ("full", 24, 128, "fp16", 4608, 4608),
    ]


def test_config_from_a_file_and_explicit_fields_override_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    [v] = _one(client="transformers", config=str(tmp_path), head_dim=128, dtype="float16", seq_lens=[32])
    assert (v["heads_q"], v["head_dim"], v["dtype"]) == (8, 128, "fp16")


def test_plain_script_declares_the_fields_itself() -> None:
    [v] = _one(client="torch", heads={"q": 16, "kv": 4}, head_dim=128, buckets=[2048], batches=[2])
    assert (v["name"], v["mask"], v["heads_q"], v["heads_kv"], v["pad_from"]) == (
        "m-b2-s2048",
        "causal",
        16,
        4,
        1,
    )


@pytest.mark.parametrize(
    ("decl", "message"),
    [
        (
            {
                "client": "diffusers",
                "config": {"num_attention_heads": 2, "attention_head_dim": 64},
                "buckets": [256, 512],
            },
            "need a causal or sliding_window mask",
        ),
        (
            {"client": "transformers", "config": LLAMA | {"torch_dtype": "float32"}, "seq_lens": [64]},
            "fp32 is not supported",
        ),
        (
            {"client": "transformers", "config": {"hidden_size": 64}, "seq_lens": [64]},
            "heads_q, head_dim unknown",
        ),
        (
            {"client": "transformers", "config": "/no/such/config.json", "seq_lens": [64]},
            "/no/such/config.json",
        ),
        ({"client": "torch", "config": LLAMA, "seq_lens": [64]}, "has no model config"),
        ({"client": "torch", "heads_q": 4, "head_dim": 64}, "declare seq_lens or buckets"),
        (
            {
                "client": "torch",
                "heads_q": 4,
                "head_dim": 64,
                "seq_lens": [64],
                "device": "cpu",
                "training": True,
            },
            "no backward on CPU",
        ),
        ({"client": "torch", "heads_q": 4, "head_dim": 64, "seq_lens": [0]}, "must be positive"),
        ({"client": "keras", "heads_q": 4, "head_dim": 64, "seq_lens": [64]}, "client"),
    ],
)
def test_bad_declarations_are_refused_naming_the_client(decl: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_variants({"clients": [{"name": "bad", **decl}]}, "matrix.yaml: flex")


def test_matrix_section_mixes_variants_and_clients_and_names_stay_unique(tmp_path: Path) -> None:
    f = tmp_path / "matrix.yaml"
    f.write_text(
        "version: 1\nflex:\n  variants:\n    - {name: causal-bf16}\n  clients:\n"
        "    - {name: causal, client: torch, heads_q: 4, head_dim: 64, seq_lens: [128]}\n"
    )
    assert [v.name for v in load_variants(f)] == ["causal-bf16", "causal-b1-s128"]
    f.write_text(
        "flex:\n  variants:\n    - {name: x-b1-s128}\n  clients:\n"
        "    - {name: x, client: torch, heads_q: 4, head_dim: 64, seq_lens: [128]}\n"
    )
    with pytest.raises(ConfigurationError, match="appears twice"):
        load_variants(f)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"pad_from": 0}, "pad_from 0 must be in 1..seq_len"),
        ({"mask": "document", "pad_from": 1}, "padded keys would be attended to"),
        ({"mask": "full", "pad_from": 100}, "padded keys would be attended to"),
        ({"scale": -1.0}, "scale must be > 0"),
    ],
)
def test_variant_bucket_and_scale_checks(extra: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_variants([{"name": "v", "seq_len": 128} | extra])
    assert FlexVariant(name="ok", mask="full", seq_len=128, pad_from=128).pad_from == 128  # exact: any mask
