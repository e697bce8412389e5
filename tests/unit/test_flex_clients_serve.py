"""Serving client calls from built variants (attnforge.flex.runtime.server and the client adapters), on CPU.

The variants here are declared like users declare them; their kernel is FlexAttention itself run eagerly
(the compiled artifacts need minutes to build: tests/integration/test_flex_cpu_wheel_clients.py runs the
real AOTInductor packages). What is checked: which variant a call picks, padding to a length bucket is exact
for causal and sliding-window masks and wrong for full attention, and real transformers and diffusers models
route their attention through attnforge (counted) with the output of their own eager attention."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from attnforge.flex import runtime  # noqa: E402
from attnforge.flex.flex_spec import parse_variants  # noqa: E402
from attnforge.flex.runtime import envkeys, mods  # noqa: E402
from attnforge.flex.runtime.loader import _Guarded  # noqa: E402
from attnforge.flex.runtime.server import Call, Server, run_padded  # noqa: E402

LLAMA = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64, "torch_dtype": "bfloat16"}
DECL = {
    "clients": [
        {
            "name": "llama",
            "client": "transformers",
            "config": LLAMA,
            "buckets": [32, 64],
            "batches": [2],
            "device": "cpu",
        },
        {
            "name": "mistral",
            "client": "transformers",
            "config": LLAMA | {"sliding_window": 8},
            "buckets": [32],
            "batches": [2],
            "device": "cpu",
        },
        {
            "name": "flux",
            "client": "diffusers",
            "config": {"num_attention_heads": 2, "attention_head_dim": 16},
            "seq_lens": [48],
            "device": "cpu",
        },
        {
            "name": "script",
            "client": "torch",
            "heads_q": 2,
            "head_dim": 16,
            "seq_lens": [64],
            "device": "cpu",
        },
    ]
}


def _artifacts(tmp_path: Path, env: dict[str, Any] | None = None) -> Path:
    art = tmp_path / "artifacts"
    art.mkdir(exist_ok=True)
    specs = [v.as_dict() for v in parse_variants(DECL)]
    manifest = {
        "schema": 1,
        "env": env or envkeys.collect("cpu"),
        "variants": [{"name": s["name"], "spec": s} for s in specs],
    }
    (art / "manifest.json").write_text(json.dumps(manifest))
    return art


def _eager(server: Server) -> Server:
    """Each variant's kernel: FlexAttention run eagerly (what its compiled artifacts compute)."""
    for s in server.specs:
        server._fns[s["name"]] = _Guarded(mods.FlexCall(s, "cpu", compiled=False), s)
    return server


def _call(**kw: Any) -> Call:
    base = {
        "batch": 2,
        "heads_q": 4,
        "heads_kv": 2,
        "seq_len": 20,
        "head_dim": 16,
        "dtype": "bf16",
        "device": "cpu",
        "mask": "causal",
    }
    return Call(**(base | kw))


def test_lookup_picks_the_shortest_length_that_serves_the_call(tmp_path: Path) -> None:
    server = Server(_artifacts(tmp_path))
    assert server.lookup(_call(seq_len=20))[0]["name"] == "llama-b2-s32"  # type: ignore[index]
    assert server.lookup(_call(seq_len=32))[0]["name"] == "llama-b2-s32"  # type: ignore[index]
    assert server.lookup(_call(seq_len=33))[0]["name"] == "llama-b2-s64"  # type: ignore[index]
    assert server.lookup(_call(seq_len=20, mask="sliding_window", window=7))[0]["name"] == "mistral-b2-s32"  # type: ignore[index]
    spec, why = server.lookup(_call(seq_len=65))
    assert spec is None and why == "length 65 is outside the declared lengths (1-32, 33-64)"
    for other in (
        _call(batch=3),
        _call(dtype="fp16"),
        _call(scale=0.5),
        _call(mask="sliding_window", window=8),
        _call(head_dim=32),
        _call(softcap=30.0),
        _call(grad=True),
    ):
        spec, why = server.lookup(other)
        assert spec is None and "no variant with these" in why, other
    assert server.lookup(_call(scale=16**-0.5))[0] is not None  # the default scale, given explicitly


def test_unserved_call_logs_one_line_per_shape(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = _eager(Server(_artifacts(tmp_path), client="transformers"))
    q, k, v = (torch.randn(2, h, 70, 16, dtype=torch.bfloat16) for h in (4, 2, 2))
    with caplog.at_level(logging.WARNING, logger="attnforge_flex"):
        for _ in range(3):
            assert server.run(Call.of(q, k, v, "causal"), q, k, v) is None
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "attnforge_flex: transformers: B2 S70 H4/2 D16 bf16 cpu causal fwd not served "
        "(length 70 is outside the declared lengths (1-32, 33-64)); compiling as usual"
    ]
    assert server.counts["not served"] == 3


@pytest.mark.parametrize(
    ("mask", "window", "exact"), [("causal", None, True), ("sliding_window", 5, True), ("full", None, False)]
)
def test_padding_to_a_bucket_is_exact_only_where_padded_keys_are_invisible(
    mask: str, window: int | None, exact: bool
) -> None:
    v = {
        "name": "v",
        "mask": mask,
        "window": window,
        "heads_q": 2,
        "heads_kv": 2,
        "head_dim": 16,
        "seq_len": 40,
        "dtype": "bf16",
    }
    q, k, vv = (torch.randn(1, 2, 23, 16).to(torch.bfloat16) for _ in range(3))
    ref = mods.FlexCall(v | {"seq_len": 23}, "cpu", compiled=False)(q, k, vv)
    got = run_padded(mods.FlexCall(v, "cpu", compiled=False), 40, q, k, vv)
    assert got.shape == ref.shape
    err = (got.float() - ref.float()).abs().max().item()
    assert (err < 1e-2) == exact, err


def test_padded_gradients_equal_unpadded_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """The padded queries' rows are cut off, so the real keys and values get exactly their real gradients.
    (torch refuses FlexAttention's backward on CPU; its eager backward is what the GPU kernel computes.)"""
    import torch.nn.attention.flex_attention as fa

    monkeypatch.setattr(fa, "_validate_device", lambda q, k, v: None)
    v = {
        "name": "v",
        "mask": "causal",
        "heads_q": 2,
        "heads_kv": 1,
        "head_dim": 16,
        "seq_len": 48,
        "dtype": "bf16",
    }
    base = [torch.randn(1, h, 30, 16, dtype=torch.float64) for h in (2, 1, 1)]
    go = torch.randn(1, 2, 30, 16, dtype=torch.float64)
    grads = []
    for length in (30, 48):
        q, k, vv = (t.clone().requires_grad_(True) for t in base)
        fn = mods.FlexCall(v | {"seq_len": length}, "cpu", compiled=False)
        run_padded(fn, length, q, k, vv).backward(go)
        grads.append([t.grad for t in (q, k, vv)])
    for a, b in zip(*grads, strict=True):
        assert a is not None and b is not None and torch.allclose(a, b, atol=1e-10), (a - b).abs().max()


def test_stale_artifacts_warn_once_and_serve_nothing(tmp_path: Path) -> None:
    runtime.artifact_manifest._warned.clear()
    art = _artifacts(tmp_path, envkeys.collect("cpu") | {"torch": "1.0.0"})
    with pytest.warns(runtime.FlexCacheWarning, match="another environment: torch") as rec:
        servers = runtime.enable(["torch", "transformers"], artifacts=art)
    assert len([w for w in rec if issubclass(w.category, runtime.FlexCacheWarning)]) == 1
    q = torch.randn(2, 4, 20, 16, dtype=torch.bfloat16)
    for server in servers.values():
        assert server.disabled and server.specs == []
        assert server.run(_call(), q, q[:, :2], q[:, :2]) is None
    with pytest.raises(ValueError, match="unknown client 'keras'"):
        runtime.enable(["keras"])


@pytest.fixture()
def clients(tmp_path: Path) -> Any:
    """enable() over the declared variants with eager kernels; undone afterwards."""
    from attnforge.flex.runtime import client_diffusers, client_transformers

    servers = runtime.enable(artifacts=_artifacts(tmp_path))
    for server in servers.values():
        _eager(server)
    yield servers
    client_transformers.disable()
    client_diffusers.disable()


def _decoder(cls_name: str, **extra: Any) -> Any:
    import transformers

    cfg = getattr(transformers, f"{cls_name}Config")(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **extra,
    )
    torch.manual_seed(0)
    return getattr(transformers, f"{cls_name}ForCausalLM")(cfg).to(torch.bfloat16).eval()


@pytest.mark.parametrize(
    ("model", "extra", "seq_len", "served_by"),
    [
        ("Llama", {}, 20, "llama-b2-s32"),  # padded up to the 32 bucket
        ("Llama", {}, 64, "llama-b2-s64"),
        ("Mistral", {"sliding_window": 8}, 30, "mistral-b2-s32"),  # the window binds: 30 > 8
    ],
)
@pytest.mark.parametrize("impl", ["flex_attention", "attnforge_flex"])
def test_transformers_decoder_runs_attnforge_with_eager_attention_output(
    clients: Any, model: str, extra: dict, seq_len: int, served_by: str, impl: str
) -> None:
    m = _decoder(model, **extra)
    ids = torch.randint(0, 128, (2, seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        m.set_attn_implementation("eager")
        ref = m(ids).logits.float()
        m.set_attn_implementation(impl)
        got = m(ids).logits.float()
    server = clients["transformers"]
    assert server.counts["compile"] == 2 and server.counts["not served"] == 0  # both layers, eager kernels
    assert server.by_variant == {served_by: 2}
    assert (got - ref).abs().max().item() < 0.02 * ref.abs().max().item()


def test_transformers_masks_other_than_plain_go_to_transformers_own_flex_mask(clients: Any) -> None:
    from torch.nn.attention.flex_attention import BlockMask
    from transformers.masking_utils import causal_mask_function

    from attnforge.flex.runtime.client_transformers import mask, plain

    padded = torch.tensor([[1] * 20, [0] * 4 + [1] * 16], dtype=torch.bool)
    assert plain(20, 20) and plain(20, 20, attention_mask=torch.ones(2, 20, dtype=torch.bool))
    assert plain(20, 20, allow_is_causal_skip=False, allow_is_bidirectional_skip=True)  # an encoder
    assert not plain(20, 20, attention_mask=padded)
    assert not plain(1, 21, q_offset=20)  # decoding with a cache
    assert not plain(20, 20, allow_is_causal_skip=False)  # packed sequences, mask overlays
    assert mask(2, 20, 20, mask_function=causal_mask_function) is None
    got = mask(2, 20, 20, mask_function=causal_mask_function, attention_mask=padded, device="cpu")
    assert isinstance(got, BlockMask) and got.shape[0] == 2


def test_diffusers_flux_runs_attnforge_behind_the_flex_backend(clients: Any) -> None:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    t = (
        FluxTransformer2DModel(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=[4, 4, 8],
        )
        .to(torch.bfloat16)
        .eval()
    )
    g = torch.Generator().manual_seed(2)
    img, txt = 32, 16  # 48 tokens: the declared length
    inp = {
        "hidden_states": torch.randn(1, img, 4, generator=g).to(torch.bfloat16),
        "encoder_hidden_states": torch.randn(1, txt, 32, generator=g).to(torch.bfloat16),
        "pooled_projections": torch.randn(1, 32, generator=g).to(torch.bfloat16),
        "timestep": torch.tensor([1.0]),
        "img_ids": torch.zeros(img, 3),
        "txt_ids": torch.zeros(txt, 3),
    }
    with torch.no_grad():
        ref = t(**inp).sample.float()  # diffusers' native (SDPA) attention
        t.set_attention_backend("flex")
        got = t(**inp).sample.float()
    server = clients["diffusers"]
    assert server.counts["compile"] == 2 and server.by_variant == {"flux-b1-s48": 2}
    assert (got - ref).abs().max().item() < 0.02 * ref.abs().max().item()


def test_plain_script_drop_in_serves_an_equal_block_mask(clients: Any) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    from attnforge.flex.runtime import client_torch

    def my_causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:  # the user's own, by another name
        return kv_idx <= q_idx

    def shifted(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return kv_idx <= q_idx + 1

    q, k, v = (torch.randn(1, 2, 64, 16, dtype=torch.bfloat16) for _ in range(3))
    bm = create_block_mask(my_causal, None, None, 64, 64, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = runtime.flex_attention(q, k, v, block_mask=bm)
        ref = mods.FlexCall({"mask": "causal", "heads_q": 2, "heads_kv": 2}, "cpu", compiled=False)(q, k, v)
    assert clients["torch"].counts["compile"] == 1 and torch.equal(got, ref)
    call = Call.of(q, k, v, "full")
    other = create_block_mask(shifted, None, None, 64, 64, device="cpu")
    assert client_torch._kind(other, call, clients["torch"]) is None
    assert client_torch._kind(bm, call, clients["torch"]) == ("causal", None)


def test_a_corrupted_package_warns_once_and_the_variant_compiles_instead(tmp_path: Path) -> None:
    runtime.artifact_manifest._warned.clear()
    art = _artifacts(tmp_path)
    manifest = json.loads((art / "manifest.json").read_text())
    entry = manifest["variants"][0]
    (art / "pkg.pt2").write_bytes(b"not the built package")
    entry["aoti"] = {"file": "pkg.pt2", "ok": True, "sha256": "0" * 64}
    (art / "manifest.json").write_text(json.dumps(manifest))
    server = Server(art, client="transformers")
    assert server.disabled is None
    with pytest.warns(runtime.FlexCacheWarning, match="AOTInductor package not used: sha256 differs") as rec:
        fn = runtime.attention(entry["name"], art)
        runtime.attention(entry["name"], art)
    assert len(rec) == 1 and fn.packaged is None and fn.pre is None  # the call compiles the same variant


def test_a_call_describes_itself_with_what_is_not_default() -> None:
    assert _call(scale=0.25).describe() == "B2 S20 H4/2 D16 bf16 cpu causal fwd"  # 0.25 = 1/sqrt(16)
    assert _call(scale=0.5, mask="sliding_window", window=7, softcap=30.0, grad=True).describe() == (
        "B2 S20 H4/2 D16 bf16 cpu sliding_window window=7 softcap=30 scale=0.5 fwd+bwd"
    )
