from __future__ import annotations

import pytest

from attnviz.heads import head_label, kv_group, structure_notes


def test_head_label_plain_multi_head() -> None:
    assert [head_label(h, 3, 3) for h in range(3)] == ["h0", "h1", "h2"]
    assert head_label(2, 3) == "h2"


def test_head_label_names_the_key_value_group() -> None:
    # 8 query heads over 2 key/value heads: heads 0-3 read kv0, heads 4-7 read kv1.
    assert [head_label(h, 8, 2) for h in (0, 3, 4, 7)] == ["h0 (kv0)", "h3 (kv0)", "h4 (kv1)", "h7 (kv1)"]
    # Multi-query attention: one key/value head for all.
    assert head_label(5, 6, 1) == "h5 (kv0)"


def test_kv_group_matches_repeat_interleave() -> None:
    """The grouping the label claims is the one attention.py computes with."""
    import torch

    kv = torch.arange(3)  # key/value head ids
    expanded = kv.repeat_interleave(12 // 3)  # what MultiHeadAttention does for 12 heads over 3
    assert [kv_group(h, 12, 3) for h in range(12)] == expanded.tolist()


@pytest.mark.parametrize(("head", "heads", "kv"), [(3, 3, 3), (-1, 4, 2), (0, 4, 3), (0, 4, 0)])
def test_bad_head_arguments_raise(head: int, heads: int, kv: int) -> None:
    with pytest.raises(ValueError):
        head_label(head, heads, kv)


def test_structure_notes() -> None:
    assert structure_notes(False, 12, 12) == []
    notes = structure_notes(True, 4, 2)
    assert notes[0].startswith("causal") and "earlier tokens" in notes[0]
    assert "4 query heads share 2 key/value heads" in notes[1]
