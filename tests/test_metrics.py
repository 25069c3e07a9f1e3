"""attnviz.measures.metrics on hand-made rows with known answers, plus property tests."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attnviz.errors import TokenNotFoundError, UsageError
from attnviz.measures import metrics
from attnviz.result import Attention, Provenance
from attnviz.select import find_targets
from attnviz.shape import ModelShape
from attnviz.tokens import Tokens

# --- hand-made sentences ---------------------------------------------------------------


def make_tokens(text: str, words: list[tuple[str, int, int]]) -> Tokens:
    """[CLS] + the given (piece, start, end) + [SEP]."""
    pieces = ("[CLS]", *(w for w, _, _ in words), "[SEP]")
    offsets = ((0, 0), *((a, b) for _, a, b in words), (0, 0))
    special = (True, *([False] * len(words)), True)
    return Tokens(text=text, ids=tuple(range(len(pieces))), pieces=pieces, offsets=offsets, special=special)


# 0:[CLS] 1:the 2:cat 3:sat 4:on 5:the 6:mat 7:[SEP]
CAT = make_tokens(
    "the cat sat on the mat",
    [("the", 0, 3), ("cat", 4, 7), ("sat", 8, 11), ("on", 12, 14), ("the", 15, 18), ("mat", 19, 22)],
)
# 0:[CLS] 1:the 2:council 3:##men 4:met 5:[SEP]
SPLIT = make_tokens("the councilmen met", [("the", 0, 3), ("council", 4, 11), ("##men", 11, 14), ("met", 15, 18)])


def make_att(tokens: Tokens, weights: np.ndarray, queries: tuple[int, ...], causal: bool = False) -> Attention:
    n, h = weights.shape[:2]
    prov = Provenance(
        model="hand",
        model_path="/nowhere",
        architecture="bert",
        engine="own",
        device="cpu",
        dtype="float32",
        shape=ModelShape(num_layers=n, num_heads=h, num_kv_heads=h, causal=causal),
    )
    return Attention(
        tokens=tokens, weights=weights.astype(np.float32), layers=tuple(range(n)), queries=queries, provenance=prov
    )


def one_hot(size: int, i: int) -> np.ndarray:
    row = np.zeros(size)
    row[i] = 1.0
    return row


# --- per-row statistics ----------------------------------------------------------------


def test_entropy_known_answers() -> None:
    assert metrics.entropy(np.full(8, 1 / 8)) == pytest.approx(1.0)
    assert metrics.entropy(one_hot(8, 3)) == 0.0
    # Half on each of two tokens out of four: log 2 / log 4.
    assert metrics.entropy(np.array([0.5, 0.5, 0.0, 0.0])) == pytest.approx(0.5)
    # One token: nothing to spread over, defined as 0 (not 0/0).
    assert metrics.entropy(np.array([1.0])) == 0.0
    assert metrics.entropy(np.zeros(5)) == 0.0
    # Batched over leading axes.
    rows = np.stack([np.full(4, 0.25), one_hot(4, 0)])
    np.testing.assert_allclose(metrics.entropy(rows), [1.0, 0.0])


def test_entropy_causal_normalises_by_visible_tokens() -> None:
    # A decoder query at position 2 sees 3 tokens; uniform over them is entropy 1, not log3/log6.
    row = np.array([1 / 3, 1 / 3, 1 / 3, 0.0, 0.0, 0.0])
    assert metrics.entropy(row) == pytest.approx(math.log(3) / math.log(6))
    assert metrics.entropy(row, metrics.causal_mask(6, 2)) == pytest.approx(1.0)
    # The first token of a decoder sees only itself.
    assert metrics.entropy(one_hot(6, 0), metrics.causal_mask(6, 0)) == 0.0


def test_shares_known_answers() -> None:
    special = np.array([True, False, False, False, True])
    all_on_sep = one_hot(5, 4)
    assert metrics.sink(all_on_sep, special) == 1.0
    assert metrics.sink(one_hot(5, 2), special) == 0.0
    row = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    assert metrics.sink(row, special) == pytest.approx(0.35)
    assert metrics.self_share(row, 2) == pytest.approx(0.3)
    assert metrics.prev_share(row, 2) == pytest.approx(0.2)
    assert metrics.next_share(row, 2) == pytest.approx(0.15)
    # A split query word (pieces 1-2): self covers both, prev/next sit outside the span.
    assert metrics.self_share(row, (1, 2)) == pytest.approx(0.5)
    assert metrics.prev_share(row, (1, 2)) == pytest.approx(0.1)
    assert metrics.next_share(row, (1, 2)) == pytest.approx(0.15)
    # Edges: nothing before position 0, nothing after the last token.
    assert metrics.prev_share(row, 0) == 0.0
    assert metrics.next_share(row, 4) == 0.0


def test_mean_distance_and_target_weight() -> None:
    assert metrics.mean_distance(one_hot(7, 6), 2) == 4.0
    assert metrics.mean_distance(one_hot(7, 2), 2) == 0.0
    # Half one token back, half three ahead: 0.5·1 + 0.5·3.
    assert metrics.mean_distance(np.array([0, 0.5, 0, 0, 0, 0.5, 0]), 2) == pytest.approx(2.0)
    # Distance from the nearest piece of a split query (pieces 2, 3).
    assert metrics.mean_distance(one_hot(7, 5), (2, 3)) == 2.0
    row = np.array([0.1, 0.2, 0.3, 0.4])
    assert metrics.target_weight(row, (1, 3)) == pytest.approx(0.6)
    assert metrics.target_weight(row, ()) == 0.0


def test_top_k_orders_and_breaks_ties_by_position() -> None:
    idx, w = metrics.top_k(np.array([0.1, 0.4, 0.1, 0.4]), 3)
    assert idx.tolist() == [1, 3, 0]
    np.testing.assert_allclose(w, [0.4, 0.4, 0.1])
    idx, _ = metrics.top_k(np.array([0.5, 0.5]), 5)  # k larger than S is cut to S
    assert idx.tolist() == [0, 1]
    with pytest.raises(ValueError):
        metrics.top_k(np.ones(3), 0)


rows_strategy = arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 12)), elements=st.floats(0, 1))


@settings(max_examples=60, deadline=None)
@given(rows_strategy, st.data())
def test_properties(raw: np.ndarray, data: st.DataObject) -> None:
    total = raw.sum(-1, keepdims=True)
    rows = np.where(total > 0, raw / np.where(total > 0, total, 1), 1.0 / raw.shape[-1])  # each row sums to 1
    size = rows.shape[-1]
    q = data.draw(st.integers(0, size - 1))
    special = np.zeros(size, dtype=bool)
    special[0] = special[-1] = True
    h = metrics.entropy(rows)
    assert np.all((h >= 0) & (h <= 1))
    hc = metrics.entropy(rows, metrics.causal_mask(size, q))
    assert np.all((hc >= 0) & (hc <= 1))
    me, pv, nx = (f(rows, q) for f in (metrics.self_share, metrics.prev_share, metrics.next_share))
    assert np.all(me + pv + nx <= 1 + 1e-9)  # three disjoint positions
    assert np.all((metrics.sink(rows, special) >= 0) & (metrics.sink(rows, special) <= 1 + 1e-9))
    d = metrics.mean_distance(rows, q)
    assert np.all((d >= 0) & (d <= size - 1 + 1e-9))
    _, top = metrics.top_k(rows, size)
    assert np.all(np.diff(top, axis=-1) <= 0)
    np.testing.assert_allclose(top[..., 0], rows.max(-1))


# --- targets -----------------------------------------------------------------------------


def test_find_targets_sums_occurrences_or_picks_one() -> None:
    assert find_targets(CAT, ["cat"]) == {"cat": (2,)}
    assert find_targets(CAT, ["the"]) == {"the": (1, 5)}
    assert find_targets(CAT, ["THE:2"]) == {"THE:2": (5,)}
    assert find_targets(SPLIT, ["councilmen"]) == {"councilmen": (2, 3)}


def test_find_targets_errors_list_the_tokens() -> None:
    with pytest.raises(TokenNotFoundError, match=r"'dog' is not in sentence B.*2:cat"):
        find_targets(CAT, ["dog"], where="sentence B")
    with pytest.raises(TokenNotFoundError, match="occurs 2 times"):
        find_targets(CAT, ["the:3"])
    with pytest.raises(UsageError, match="count from 1"):
        find_targets(CAT, ["the:0"])


# --- tables ----------------------------------------------------------------------------


def stats(att: Attention, query: tuple[int, ...], targets: list[str] | tuple[str, ...] = (), top: int = 3) -> list:
    return metrics.head_stats(att, query, find_targets(att.tokens, targets), top)


def head_table(att: Attention, query: tuple[int, ...], targets: list[str] | tuple[str, ...] = (), top: int = 3) -> list:
    """The rows as compare --json prints them (HeadStats.to_dict: the JSON schema)."""
    return [row.to_dict() for row in stats(att, query, targets, top)]


def cat_attention() -> Attention:
    # Query "sat" (3); 1 layer, 3 heads: one on "cat", one on [SEP], one uniform.
    w = np.zeros((1, 3, 1, 8))
    w[0, 0, 0] = [0, 0.1, 0.7, 0.2, 0, 0, 0, 0]
    w[0, 1, 0] = one_hot(8, 7)
    w[0, 2, 0] = np.full(8, 1 / 8)
    return make_att(CAT, w, (3,))


def test_head_table_rows() -> None:
    rows = head_table(cat_attention(), (3,), ["cat", "the"], top=2)
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (0, 2)]
    r0, r1, r2 = rows
    assert r0["top"][0][0] == "cat" and r0["top"][0][1] == pytest.approx(0.7)
    assert r0["top_index"] == [2, 3]
    assert r0["targets"] == {"cat": pytest.approx(0.7), "the": pytest.approx(0.1)}
    assert r0["self"] == pytest.approx(0.2) and r0["prev"] == pytest.approx(0.7) and r0["next"] == 0.0
    assert r0["distance"] == pytest.approx(0.1 * 2 + 0.7 * 1)
    # All on [SEP]: distance leaves special tokens out, and nothing else is left.
    assert r1["sink"] == pytest.approx(1.0) and r1["entropy"] == 0.0 and r1["distance"] == 0.0
    assert r2["entropy"] == pytest.approx(1.0)
    assert r2["targets"]["the"] == pytest.approx(2 / 8)  # both occurrences
    json.dumps(rows)  # plain JSON types only


def test_split_query_word_averages_its_pieces() -> None:
    w = np.zeros((1, 1, 2, 6))
    w[0, 0, 0] = one_hot(6, 4)  # council -> met
    w[0, 0, 1] = one_hot(6, 1)  # ##men -> the
    (row,) = head_table(make_att(SPLIT, w, (2, 3)), (2, 3), ["met", "the"])
    assert row["targets"] == {"met": pytest.approx(0.5), "the": pytest.approx(0.5)}
    assert row["prev"] == pytest.approx(0.5) and row["next"] == pytest.approx(0.5) and row["self"] == 0.0


def test_sort_rows() -> None:
    rows = stats(cat_attention(), (3,), ["cat"])
    assert [r.head for r in metrics.sort_rows(rows)] == [0, 2, 1]  # weight on "cat"
    assert [r.head for r in metrics.sort_rows(rows, "entropy")] == [1, 0, 2]
    assert [r.head for r in metrics.sort_rows(rows, "sink", limit=1)] == [1]
    # Distance over the non-special tokens: uniform over tokens 1..6 from 3 is 9/6, h0 0.9, h1 0.
    assert [r.head for r in metrics.sort_rows(rows, "distance")] == [2, 0, 1]
    untargeted = stats(cat_attention(), (3,))
    assert [r.head for r in metrics.sort_rows(untargeted)] == [1, 0, 2]  # top weight: 1.0, 0.7, 0.125
    with pytest.raises(UsageError, match="cannot sort by 'size'"):
        metrics.sort_rows(rows, "size")
    with pytest.raises(UsageError, match="needs two sentences"):
        metrics.sort_rows(rows, "delta")


def test_pair_stats_align_targets_by_text() -> None:
    a = cat_attention()
    # B swaps "cat" and "mat": "cat" is now token 6.
    b_tokens = make_tokens(
        "the mat sat on the cat",
        [("the", 0, 3), ("mat", 4, 7), ("sat", 8, 11), ("on", 12, 14), ("the", 15, 18), ("cat", 19, 22)],
    )
    w = np.zeros((1, 3, 1, 8))
    w[0, 0, 0] = one_hot(8, 6)  # head 0: all on "cat" (position 6 now): +0.3
    w[0, 1, 0] = one_hot(8, 7)  # head 1: unchanged
    w[0, 2, 0] = one_hot(8, 2)  # head 2: all on "mat": "cat" 1/8 -> 0
    b = make_att(b_tokens, w, (3,))
    rows = metrics.pair_stats(a, (3,), find_targets(a.tokens, ["cat"]), b, (3,), find_targets(b_tokens, ["cat"]))
    by_head = {r.head: r.to_dict() for r in rows}
    assert by_head[0]["targets_vs"]["cat"] == pytest.approx(1.0)
    assert by_head[0]["delta"]["cat"] == pytest.approx(0.3)
    assert by_head[2]["delta"]["cat"] == pytest.approx(-1 / 8)
    assert [r.head for r in metrics.sort_rows(rows)] == [0, 2, 1]  # by largest |change|
    with pytest.raises(UsageError, match="at least one target"):
        metrics.pair_stats(a, (3,), {}, a, (3,), {})
    with pytest.raises(UsageError, match="targets differ"):
        metrics.pair_stats(a, (3,), {"cat": (2,)}, a, (3,), {"mat": (2,)})
