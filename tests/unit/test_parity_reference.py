"""The fp32 reference and its masks agree with PyTorch's own attention (CPU, no GPU needed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from attnforge import reference as R  # noqa: E402


def _qkv(b: int, sq: int, sk: int, hq: int, hk: int, d: int, dtype: object = None) -> tuple:
    g = torch.Generator().manual_seed(0)
    dt = dtype or torch.float32
    return tuple(torch.randn(b, s, h, d, generator=g).to(dt) for s, h in ((sq, hq), (sk, hk), (sk, hk)))


def _sdpa(q, k, v, **kw):  # (b, s, h, d) in and out
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw
    )
    return o.transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
def test_matches_sdpa_math(causal: bool) -> None:
    q, k, v = _qkv(2, 37, 37, 4, 4, 16)
    out, probs = R.attention_ref(q, k, v, causal=causal)
    torch.testing.assert_close(out, _sdpa(q, k, v, is_causal=causal), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 37), atol=1e-5, rtol=0)


def test_gqa_repeats_kv_heads_in_groups() -> None:
    q, k, v = _qkv(1, 9, 11, 6, 2, 8)
    out, _ = R.attention_ref(q, k, v)
    ref = _sdpa(q, k.repeat_interleave(3, dim=2), v.repeat_interleave(3, dim=2))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_causal_is_bottom_right_aligned() -> None:
    # flash-attn's docstring: seqlen_q=2, seqlen_k=5 -> [[1 1 1 1 0], [1 1 1 1 1]]
    blocked = R.local_mask(2, 5, (-1, 0))
    assert (~blocked).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    # seqlen_q=5, seqlen_k=2: the first three rows see nothing and give zero output, not NaN
    q, k, v = _qkv(1, 5, 2, 1, 1, 4)
    out, _ = R.attention_ref(q, k, v, causal=True)
    assert torch.isfinite(out).all() and out[0, :3].abs().max() == 0


def test_sliding_window_left_right() -> None:
    allowed = ~R.local_mask(6, 6, (2, 1))
    for i in range(6):
        assert [j for j in range(6) if allowed[i, j]] == [j for j in range(6) if i - 2 <= j <= i + 1]
    # right unbounded
    assert (~R.local_mask(4, 4, (1, -1)))[0].tolist() == [True, True, True, True]


def test_softcap_and_bias_enter_the_scores() -> None:
    q, k, v = _qkv(1, 8, 8, 2, 2, 16)
    capped, _ = R.attention_ref(q * 20, k, v, softcap=5.0)
    s = torch.einsum("bthd,bshd->bhts", q * 20 / 4.0, k)
    manual = torch.einsum("bhts,bshd->bthd", torch.softmax(torch.tanh(s / 5.0) * 5.0, -1), v)
    torch.testing.assert_close(capped, manual, atol=1e-5, rtol=1e-5)
    slopes = torch.tensor([[0.5, 0.25]])
    bias = R.alibi_bias(slopes, 8, 8, causal=False)
    assert bias.shape == (1, 2, 8, 8) and bias[0, 0, 3, 1] == -1.0 and bias[0, 1, 3, 3] == 0


def test_alibi_causal_shortcut_equals_full_form_under_softmax() -> None:
    q, k, v = _qkv(1, 7, 7, 2, 2, 8)
    slopes = torch.tensor([[0.3, 0.1]])
    a, _ = R.attention_ref(q, k, v, causal=True, bias=R.alibi_bias(slopes, 7, 7, causal=True))
    b, _ = R.attention_ref(q, k, v, causal=True, bias=R.alibi_bias(slopes, 7, 7, causal=False))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_padding_masks_and_unpad_roundtrip() -> None:
    q, k, v = _qkv(3, 10, 12, 2, 2, 8)
    q_pad = R.pad_mask_from_lens([10, 4, 7], 10)
    k_pad = R.pad_mask_from_lens([12, 5, 9], 12)
    out, _ = R.attention_ref(q, k, v, q_pad=q_pad, k_pad=k_pad, causal=True)
    assert out[1, 4:].abs().max() == 0
    one, _ = R.attention_ref(q[1:2, :4], k[1:2, :5], v[1:2, :5], causal=True)
    torch.testing.assert_close(out[1:2, :4], one, atol=1e-5, rtol=1e-5)
    x, cu, mx = R.unpad(q, q_pad)
    assert x.shape[0] == 21 and cu.tolist() == [0, 10, 14, 21] and mx == 10
    torch.testing.assert_close(R.repad(x, q_pad), q.masked_fill(~q_pad[..., None, None], 0))


def test_dropout_fraction_counts_only_attendable_positions() -> None:
    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    keep[0, 0, 3, 0] = False
    blocked = R.blocked_positions(4, 4, causal=True)
    assert R.dropout_fraction(keep, blocked) == pytest.approx(1 / 10)
    out, _ = R.attention_ref(*_qkv(1, 4, 4, 1, 1, 4), dropout_p=0.5, dropout_mask=keep.expand(1, 1, 4, 4))
    assert torch.isfinite(out).all()
