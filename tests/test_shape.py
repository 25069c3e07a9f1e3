from __future__ import annotations

import pytest

from attnviz.shape import head_label, kv_group, structure_notes


def test_head_label_plain_multi_head() -> None:
    assert [head_label(h, 3, 3) for h in range(3)] == ["h0", "h1", "h2"]
    assert head_label(2, 3) == "h2"


def test_head_label_names_the_key_value_group() -> None:
    # 8 query heads over 2 key/value heads: heads 0-3 read kv0, heads 4-7 read kv1.
    assert [head_label(h, 8, 2) for h in (0, 3, 4, 7)] == ["h0 (kv0)", "h3 (kv0)", "h4 (kv1)", "h7 (kv1)"]
    # Multi-query attention: one key/value head for all.
    assert head_label(5, 6, 1) == "h5 (kv0)"


def test_kv_group_is_the_grouping_multi_head_attention_computes_with() -> None:
    """The group a label names is the key/value head MultiHeadAttention really uses: give
    each key/value head a distinct key (so a distinct attention pattern) and check which
    pattern each query head reproduces."""
    import torch

    from attnviz.nn.attention import MultiHeadAttention

    heads, kv_heads, d = 12, 3, 4
    torch.manual_seed(0)
    attn = MultiHeadAttention(heads * d, heads, n_kv_heads=kv_heads, head_dim=d, bias=False).eval()
    x = torch.randn(1, 5, heads * d)
    with torch.no_grad():
        attn.q_proj.weight.copy_(torch.cat([torch.eye(d, heads * d)] * heads))  # every query head: x[:d]
        _, weights = attn(x)  # (1, H, L, S)
        patterns = []
        for g in range(kv_heads):
            only = torch.zeros_like(attn.k_proj.weight)
            only[g * d : (g + 1) * d] = attn.k_proj.weight[g * d : (g + 1) * d]
            k = x @ only.T  # (1, S, G·D): zero except group g
            k_g = k[..., g * d : (g + 1) * d]
            q = x[..., :d]
            patterns.append(torch.softmax(q @ k_g.transpose(-1, -2) / d**0.5, -1)[0])  # (L, S)
    for h in range(heads):
        matches = [g for g in range(kv_heads) if torch.allclose(weights[0, h], patterns[g], atol=1e-6)]
        assert matches == [kv_group(h, heads, kv_heads)], h


@pytest.mark.parametrize(("head", "heads", "kv"), [(3, 3, 3), (-1, 4, 2), (0, 4, 3), (0, 4, 0)])
def test_bad_head_arguments_raise(head: int, heads: int, kv: int) -> None:
    with pytest.raises(ValueError):
        head_label(head, heads, kv)


def test_structure_notes() -> None:
    assert structure_notes(False, 12, 12) == []
    notes = structure_notes(True, 4, 2)
    assert notes[0].startswith("causal") and "earlier tokens" in notes[0]
    assert "4 query heads share 2 key/value heads" in notes[1]
