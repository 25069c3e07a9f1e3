"""The from-scratch multi-head attention against PyTorch's own implementations."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnviz.nn.attention import MultiHeadAttention, causal_mask, softmax_attention


def _ours_from_torch(mha: nn.MultiheadAttention) -> MultiHeadAttention:
    """Copy nn.MultiheadAttention's packed in_proj (3E, E) into our per-role projections."""
    e, h = mha.embed_dim, mha.num_heads
    ours = MultiHeadAttention(e, h)
    wq, wk, wv = mha.in_proj_weight.detach().chunk(3)
    bq, bk, bv = mha.in_proj_bias.detach().chunk(3)
    with torch.no_grad():
        for proj, w, b in ((ours.q_proj, wq, bq), (ours.k_proj, wk, bk), (ours.v_proj, wv, bv)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        ours.o_proj.weight.copy_(mha.out_proj.weight)
        ours.o_proj.bias.copy_(mha.out_proj.bias)
    return ours


@pytest.mark.parametrize(("e", "h", "length"), [(48, 3, 7), (64, 8, 1), (30, 5, 13), (384, 12, 15)])
def test_matches_nn_multiheadattention(e: int, h: int, length: int) -> None:
    torch.manual_seed(e + h)
    mha = nn.MultiheadAttention(e, h, batch_first=True).eval()
    ours = _ours_from_torch(mha).eval()
    q, k, v = (torch.randn(2, length, e) for _ in range(3))
    with torch.no_grad():
        ref_out, ref_w = mha(q, k, v, need_weights=True, average_attn_weights=False)
        out, w = ours(q, k, v)
    assert w.shape == (2, h, length, length)
    assert (out - ref_out).abs().max().item() <= 1e-6
    assert (w - ref_w).abs().max().item() <= 1e-6


def test_padding_mask_matches_nn_multiheadattention() -> None:
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    ours = _ours_from_torch(mha).eval()
    x = torch.randn(2, 6, 32)
    real = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    with torch.no_grad():
        # nn.MultiheadAttention's key_padding_mask is the opposite convention: True = ignore.
        ref_out, ref_w = mha(x, x, x, key_padding_mask=~real, need_weights=True, average_attn_weights=False)
        out, w = ours(x, mask=real[:, None, None, :])
    assert (w - ref_w).abs().max().item() <= 1e-6
    assert (out - ref_out).abs().max().item() <= 1e-6
    assert torch.all(w[1, :, :, 4:] == 0.0)


def test_output_matches_fused_sdpa_with_causal_mask() -> None:
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 4, 9, 16), torch.randn(3, 4, 9, 16), torch.randn(3, 4, 9, 16)
    out, w = softmax_attention(q, k, v, causal_mask(9))
    ref = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (out - ref).abs().max().item() <= 1e-6
    upper = ~causal_mask(9)
    assert torch.all(w[..., upper] == 0.0)


def test_grouped_query_attention_matches_sdpa() -> None:
    torch.manual_seed(3)
    attn = MultiHeadAttention(48, 4, n_kv_heads=2, head_dim=12).eval()
    x = torch.randn(2, 5, 48)
    with torch.no_grad():
        out, w = attn(x)
        q = attn.q_proj(x).view(2, 5, 4, 12).transpose(1, 2)
        k = attn.k_proj(x).view(2, 5, 2, 12).transpose(1, 2)
        v = attn.v_proj(x).view(2, 5, 2, 12).transpose(1, 2)
        ref = nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        ref = attn.o_proj(ref.transpose(1, 2).reshape(2, 5, 48))
    assert (out - ref).abs().max().item() <= 1e-6
    # Heads 0 and 1 share key/value head 0, but their queries differ, so their weights do too.
    assert not torch.allclose(w[:, 0], w[:, 1])


def test_per_head_projection_is_a_column_block() -> None:
    """head_i uses exactly W_i^Q = columns i·d_k..(i+1)·d_k of W^Q (the textbook's per-head matrices)."""
    torch.manual_seed(4)
    attn = MultiHeadAttention(24, 3).eval()
    x = torch.randn(1, 4, 24)
    with torch.no_grad():
        _, w = attn(x)
        i, d = 1, 8
        wq = attn.q_proj.weight[i * d : (i + 1) * d]  # (D, E): rows of nn.Linear's weight = columns of W^Q
        wk = attn.k_proj.weight[i * d : (i + 1) * d]
        qi = x @ wq.T + attn.q_proj.bias[i * d : (i + 1) * d]
        ki = x @ wk.T + attn.k_proj.bias[i * d : (i + 1) * d]
        expected = torch.softmax(qi @ ki.transpose(-2, -1) / math.sqrt(d), dim=-1)
    assert (w[:, i] - expected).abs().max().item() <= 1e-6


def test_fully_masked_row_is_zero_not_nan() -> None:
    q = k = v = torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    _, w = softmax_attention(q, k, v, mask)
    assert not torch.isnan(w).any()
    assert torch.all(w[0, 0, 1] == 0.0)
    assert torch.all(w[0, 0, ~mask] == 0.0)


def test_rejects_inconsistent_sizes() -> None:
    with pytest.raises(ValueError, match="not divisible"):
        MultiHeadAttention(50, 3)
    with pytest.raises(ValueError, match="not a multiple"):
        MultiHeadAttention(48, 4, n_kv_heads=3)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    length=st.integers(1, 9),
    d=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_rows_are_distributions_and_masked_weights_are_exactly_zero(
    b: int, h: int, length: int, d: int, seed: int, data: st.DataObject
) -> None:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, length, d, generator=gen) * 3 for _ in range(3))
    if data.draw(st.booleans()):
        mask = causal_mask(length).expand(b, h, length, length)
    else:  # padding: some keys hidden from every query, at least one visible
        keep = data.draw(st.lists(st.booleans(), min_size=length, max_size=length))
        keep[data.draw(st.integers(0, length - 1))] = True
        mask = torch.tensor(keep)[None, None, None, :].expand(b, h, length, length)
    out, w = softmax_attention(q, k, v, mask)
    assert out.shape == (b, h, length, d)
    torch.testing.assert_close(w.sum(-1), torch.ones(b, h, length), atol=1e-5, rtol=0)
    assert torch.all(w[~mask] == 0.0)
    assert torch.all(w >= 0.0)


def test_additive_bias_matches_sdpa_float_mask_and_keeps_masked_weights_zero() -> None:
    """A score bias (T5's relative positions, DeBERTa's c2p/p2c) is added before the softmax,
    exactly as torch's SDPA adds a float attn_mask; masked positions stay exactly 0."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    bias = torch.randn(1, 3, 5, 7) * 4
    out, weights = softmax_attention(q, k, v, score_bias=bias)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + bias, dim=-1)
    assert torch.allclose(weights, expected, atol=1e-6)
    assert torch.allclose(out, nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias), atol=1e-5)
    mask = torch.ones(5, 7, dtype=torch.bool).tril()  # (L, S)
    _, masked = softmax_attention(q, k, v, mask, score_bias=bias)
    assert bool((masked[..., ~mask] == 0).all())
    attn = MultiHeadAttention(24, 3, bias=False)
    x = torch.randn(2, 5, 24)
    _, with_bias = attn(x, score_bias=bias[..., :5])
    _, without = attn(x)
    assert not torch.allclose(with_bias, without)
