"""The from-scratch multi-head attention against PyTorch's own implementations."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnviz.nn.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention


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
    out, w = scaled_dot_product_attention(q, k, v, causal_mask(9))
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
    _, w = scaled_dot_product_attention(q, k, v, mask)
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
    out, w = scaled_dot_product_attention(q, k, v, mask)
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
    out, weights = scaled_dot_product_attention(q, k, v, score_bias=bias)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + bias, dim=-1)
    assert torch.allclose(weights, expected, atol=1e-6)
    assert torch.allclose(out, nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias), atol=1e-5)
    mask = torch.ones(5, 7, dtype=torch.bool).tril()  # (L, S)
    _, masked = scaled_dot_product_attention(q, k, v, mask, score_bias=bias)
    assert bool((masked[..., ~mask] == 0).all())
    attn = MultiHeadAttention(24, 3, bias=False)
    x = torch.randn(2, 5, 24)
    _, with_bias = attn(x, score_bias=bias[..., :5])
    _, without = attn(x)
    assert not torch.allclose(with_bias, without)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 2, 3, 5), (2, 3, 700, 600), (1, 1, 3, 2**18 + 3)])
def test_blocked_softmax_is_bit_identical_to_torch(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    # The eager reference softmaxes in place, one row block at a time (no second n x n
    # tensor); it must round exactly as torch.softmax(float32).to(dtype) does, across
    # block edges (700 rows of 600 make several blocks; 2^18 + 3 keys, one row a block).
    from attnviz.nn.attention import _softmax_

    torch.manual_seed(0)
    scores = (torch.randn(shape) * 4).to(dtype)
    scores[..., 0, 1:] = float("-inf")
    expected = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    out = _softmax_(scores)
    assert out.data_ptr() == scores.data_ptr() and out.dtype == dtype
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
# One block; blocks of whole heads (2 x 5 heads of 200 x 300 make groups of 4 and 1 per
# batch element); blocks of rows (600 keys: 436 rows a block, so 700 rows make two).
@pytest.mark.parametrize("shape", [(1, 2, 3, 5), (2, 5, 200, 300), (2, 3, 700, 600)])
@pytest.mark.parametrize("masked", [False, True])
def test_scale_in_the_softmax_blocks_rounds_as_the_separate_pass(
    dtype: torch.dtype, shape: tuple[int, ...], masked: bool
) -> None:
    """The eager function scales each row block just before its softmax (one memory pass
    fewer) and masks before scaling; the weights and output must be bit-identical to the
    textbook order transformers uses: (q·kᵀ)·scale, mask, softmax in float32, back."""
    torch.manual_seed(1)
    b, h, length, keys = shape
    q, k, v = (torch.randn(b, h, n, 32).to(dtype) for n in (length, keys, keys))
    mask = torch.rand(b, 1, length, keys) > 0.3 if masked else None
    scale = 1 / math.sqrt(32)  # not a power of two: no folding into q would be exact
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    expected = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    if mask is not None:
        expected = expected.masked_fill(~mask, 0.0)
    out, weights = scaled_dot_product_attention(q, k, v, mask, scale)
    assert torch.equal(weights, expected)
    assert torch.equal(out, expected @ v)


def test_autograd_takes_the_unblocked_path_and_agrees() -> None:
    """The blocked eager path writes with ``out=``, which records no graph: with gradients
    wanted the textbook steps run instead, with the same numbers, and backward works."""
    torch.manual_seed(4)
    attn = MultiHeadAttention(48, 4).eval()
    x = torch.randn(2, 9, 48)
    with torch.no_grad():
        out_blocked, w_blocked = attn(x)
    out, w = attn(x.requires_grad_())
    assert torch.equal(w, w_blocked) and torch.equal(out, out_blocked)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
