"""attnviz.transforms against independent computations: loops over hand arrays, a direct
matrix product for rollout, and transformers' own attentions on the packaged model."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz import transforms
from attnviz.result import Attention, Provenance
from attnviz.shape import ModelShape
from attnviz.tokens import Tokens

# 0:[CLS] 1:the 2:council 3:##men 4:met 5:. 6:[SEP]
TEXT = "the councilmen met."
SPLIT = Tokens(
    text=TEXT,
    ids=tuple(range(7)),
    pieces=("[CLS]", "the", "council", "##men", "met", ".", "[SEP]"),
    offsets=((0, 0), (0, 3), (4, 11), (11, 14), (15, 18), (18, 19), (0, 0)),
    special=(True, False, False, False, False, False, True),
)
GROUPS = ((0,), (1,), (2, 3), (4,), (5,), (6,))


def make_att(weights: np.ndarray, queries: tuple[int, ...] | None = None, causal: bool = False) -> Attention:
    n, h, q, s = weights.shape
    prov = Provenance("hand", "/nowhere", "bert", "own", "cpu", "float32", ModelShape(n, h, h, causal))
    return Attention(
        tokens=SPLIT,
        weights=weights.astype(np.float32),
        layers=tuple(range(n)),
        queries=queries if queries is not None else tuple(range(q)),
        provenance=prov,
    )


def random_rows(shape: tuple[int, ...], seed: int = 0, causal: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.random(shape) ** 3  # peaked, like real heads
    if causal:
        w = np.tril(w)
    return w / w.sum(-1, keepdims=True)


def full(seed: int = 0, causal: bool = False, layers: int = 3, heads: int = 4) -> Attention:
    return make_att(random_rows((layers, heads, 7, 7), seed, causal), causal=causal)


# --- words ------------------------------------------------------------------------------


def test_word_groups_follow_the_offsets() -> None:
    assert transforms.word_groups(SPLIT) == GROUPS
    words = transforms.word_tokens(SPLIT, GROUPS)
    assert words.labels == ("[CLS]", "the", "councilmen", "met", ".", "[SEP]")
    assert words.special == (True, False, False, False, False, True)


def test_word_groups_on_the_packaged_tokenizer(own_engine) -> None:
    tokens = own_engine.tokenize("The councilmen didn't sing")
    groups = transforms.word_groups(tokens)
    words = [" ".join(tokens.pieces[i] for i in g) for g in groups]
    assert "council ##men" in words  # pieces glued letter to letter are one word
    assert "didn" in words and "'" in words and "t" in words  # an apostrophe splits, as the tokenizer does
    assert sorted(i for g in groups for i in g) == list(range(len(tokens)))


def test_merged_word_row_against_its_pieces_rows() -> None:
    att = full()
    merged = transforms.merge_words(att)
    assert merged.queries == tuple(range(6)) and merged.key_pieces == GROUPS and merged.source == SPLIT
    w = att.weights.astype(np.float64)
    for n in range(3):
        for h in range(4):
            # "councilmen" as a query: the mean of the council and ##men rows, with the
            # keys council + ##men added up.
            pieces = (w[n, h, 2] + w[n, h, 3]) / 2
            expected = [pieces[0], pieces[1], pieces[2] + pieces[3], pieces[4], pieces[5], pieces[6]]
            np.testing.assert_allclose(merged.weights[n, h, 2], expected, atol=1e-6)
            # "met" as a query keeps its row, keys summed.
            row = w[n, h, 4]
            np.testing.assert_allclose(
                merged.weights[n, h, 3], [row[0], row[1], row[2] + row[3], row[4], row[5], row[6]], atol=1e-6
            )
    np.testing.assert_allclose(merged.weights.sum(-1), 1.0, atol=1e-5)
    assert any("Clark" in s for s in merged.steps)


def test_merging_needs_every_piece_of_a_kept_query_word() -> None:
    att = make_att(random_rows((1, 2, 1, 7)), queries=(2,))
    with pytest.raises(ValueError, match="were not kept"):
        transforms.merge_words(att)
    only_met = transforms.merge_words(make_att(random_rows((1, 2, 1, 7)), queries=(4,)))
    assert only_met.queries == (3,)  # "met" is word 3


def test_merge_query_is_the_mean_of_the_pieces() -> None:
    att = make_att(random_rows((2, 3, 2, 7)), queries=(2, 3))
    one = transforms.merge_query(att, (2, 3))
    assert one.queries == (2,) and one.query_pieces == ((2, 3),)
    np.testing.assert_allclose(one.weights[:, :, 0], att.weights.mean(axis=2), atol=1e-6)
    assert one.pieces_of_query(0) == (2, 3)
    assert transforms.merge_query(att, (3,)) is att


# --- special tokens -----------------------------------------------------------------------


def test_hidden_specials_rows_renormalised() -> None:
    att = full(seed=1)
    hidden = transforms.hide_special(att)
    w = att.weights.astype(np.float64)
    assert hidden.hidden == (0, 6)
    np.testing.assert_array_equal(hidden.weights[..., [0, 6]], 0.0)
    np.testing.assert_allclose(hidden.weights.sum(-1), 1.0, atol=1e-5)
    # Renormalising keeps the ratios between the remaining tokens.
    rest = w[..., 1:6]
    np.testing.assert_allclose(hidden.weights[..., 1:6], rest / rest.sum(-1, keepdims=True), atol=1e-6)
    raw = transforms.hide_special(att, renorm=False)
    np.testing.assert_allclose(raw.weights.sum(-1), 1 - w[..., 0] - w[..., 6], atol=1e-6)
    assert "raw mass kept" in raw.steps[-1]


def test_a_row_all_on_specials_stays_zero() -> None:
    w = np.zeros((1, 1, 1, 7))
    w[..., 0] = 1.0
    out = transforms.hide_special(make_att(w, queries=(3,)))
    assert not np.isnan(out.weights).any() and out.weights.sum() == 0.0


# --- head aggregates and rollout -------------------------------------------------------------


def test_head_mean_and_max_against_loops() -> None:
    att = full(seed=2)
    agg = transforms.head_aggregates(att, ("mean", "max"))
    assert agg.num_heads == 6 and agg.model_heads == 4 and agg.aggregates == ("mean", "max")
    assert [agg.head_name(h) for h in range(6)] == ["h0", "h1", "h2", "h3", "mean", "max"]
    for n in range(3):
        for q in range(7):
            for s in range(7):
                values = [float(att.weights[n, h, q, s]) for h in range(4)]
                assert agg.weights[n, 4, q, s] == pytest.approx(sum(values) / 4, abs=1e-6)
                assert agg.weights[n, 5, q, s] == pytest.approx(max(values), abs=1e-6)
    np.testing.assert_array_equal(agg.weights[:, :4], att.weights)  # the heads are untouched
    with pytest.raises(ValueError, match="unknown head aggregate"):
        transforms.head_aggregates(att, ("median",))


def _rollout_by_hand(w: np.ndarray, upto: int) -> np.ndarray:
    """Abnar & Zuidema's recipe written out: one matrix product of every layer's Â."""
    mats = []
    for layer in range(upto + 1):
        a = sum(w[layer, h] for h in range(w.shape[1])) / w.shape[1]
        a = (a + np.eye(a.shape[0])) / 2
        a = a / a.sum(axis=1, keepdims=True)
        mats.append(a)
    return np.linalg.multi_dot(mats[::-1]) if len(mats) > 1 else mats[0]


@pytest.mark.parametrize("causal", [False, True])
def test_rollout_against_a_direct_matrix_product(causal: bool) -> None:
    att = full(seed=3, causal=causal, layers=4)
    rolled = transforms.rollout(att)
    assert rolled.aggregates == ("rollout",) and rolled.weights.shape == (4, 1, 7, 7)
    w = att.weights.astype(np.float64)
    for layer in range(4):
        np.testing.assert_allclose(rolled.weights[layer, 0], _rollout_by_hand(w, layer), atol=1e-5)
    np.testing.assert_allclose(rolled.weights.sum(-1), 1.0, atol=1e-5)
    if causal:  # no flow from later tokens, through any number of layers
        assert np.abs(np.triu(rolled.weights[:, 0], k=1)).max() == 0.0


def test_rollout_refuses_partial_input() -> None:
    att = full()
    with pytest.raises(ValueError, match="every token's row"):
        transforms.rollout(transforms.select(att, queries=(2,)))
    with pytest.raises(ValueError, match="every layer from 0"):
        transforms.rollout(transforms.select(att, layers=(1, 2)))


def test_apply_orders_the_steps() -> None:
    att = full(seed=4)
    view = transforms.View(words=True, hide_special=True, heads=("mean",), rollout=True)
    out = transforms.apply(att, view, query_groups=[(2, 3)], layers=(2,))
    # Independent: hide by hand, merge by hand, for head 1 of layer 2.
    w = att.weights.astype(np.float64)[2]
    w[..., [0, 6]] = 0
    w = w / w.sum(-1, keepdims=True)
    row = (w[:, 2] + w[:, 3]) / 2  # (H, S)
    words = np.stack([row[:, 0], row[:, 1], row[:, 2] + row[:, 3], row[:, 4], row[:, 5], row[:, 6]], -1)
    assert out.queries == (2,) and out.layers == (2,)
    assert [out.head_name(h) for h in range(out.num_heads)] == ["h0", "h1", "h2", "h3", "mean", "rollout"]
    np.testing.assert_allclose(out.weights[0, :4, 0], words, atol=1e-5)
    np.testing.assert_allclose(out.weights[0, 4, 0], words.mean(0), atol=1e-5)
    # The rollout slot: from the raw full matrices, then set aside and merged the same way.
    r = _rollout_by_hand(att.weights.astype(np.float64), 2)
    r[:, [0, 6]] = 0
    r = r / r.sum(-1, keepdims=True)
    rr = (r[2] + r[3]) / 2
    np.testing.assert_allclose(out.weights[0, 5, 0], [rr[0], rr[1], rr[2] + rr[3], rr[4], rr[5], rr[6]], atol=1e-5)
    assert out.steps[0].startswith("specials set aside") and "rollout" in out.steps[-1]


def test_transformed_attention_survives_npz_and_json(tmp_path) -> None:
    att = transforms.apply(full(seed=5), transforms.View(words=True, hide_special=True, heads=("max",)))
    path = tmp_path / "a.npz"
    att.save_npz(path)
    back = Attention.load_npz(path)
    np.testing.assert_array_equal(back.weights, att.weights)
    assert (back.aggregates, back.key_pieces, back.hidden, back.steps, back.source) == (
        att.aggregates,
        att.key_pieces,
        att.hidden,
        att.steps,
        att.source,
    )
    d = att.to_dict(2)
    assert d["heads"][-1] == "max" and d["word_pieces"][2] == ["council", "##men"] and d["hidden"] == [0, 5]
    assert len(d["weights"][0]) == 5  # 4 heads + max


# --- against transformers on the packaged model --------------------------------------------------


def test_words_and_rollout_against_transformers(own_engine, hf_engine) -> None:
    """Our pipeline (own engine) vs a computation on transformers' own attentions."""
    import torch

    from .helpers import inspect

    sentence = "The councilmen refused the demonstrators a permit because they feared violence"
    tokens = own_engine.tokenize(sentence)
    they = tokens.labels.index("they")
    council = tokens.labels.index("council")
    assert tokens.labels[council + 1] == "##men"
    att = inspect(tokens, own_engine, None, None)
    view = transforms.View(words=True, rollout=True)
    out = transforms.apply(att, view, query_groups=[(they,)], layers=(5,))
    ids = torch.tensor([tokens.ids])
    with torch.inference_mode():
        ref = hf_engine.model(input_ids=ids, output_attentions=True).attentions
    w = np.stack([a[0].numpy() for a in ref]).astype(np.float64)  # (N, H, S, S)
    row = w[5, :, they]  # (H, S)
    merged = np.concatenate([row[:, :council], row[:, council : council + 2].sum(-1, keepdims=True)], -1)
    merged = np.concatenate([merged, row[:, council + 2 :]], -1)
    word_they = out.tokens.labels.index("they")
    assert out.queries == (word_they,) and out.tokens.labels[council] == "councilmen"
    np.testing.assert_allclose(out.weights[0, :12, 0], merged, atol=1e-5)
    r = _rollout_by_hand(w, 5)[they]
    r = np.concatenate([r[:council], [r[council] + r[council + 1]], r[council + 2 :]])
    np.testing.assert_allclose(out.weights[0, 12, 0], r, atol=1e-5)


def test_parse_heads() -> None:
    assert transforms.parse_heads("1,11") == ((1, 11), ())
    assert transforms.parse_heads("mean") == (None, ("mean",))
    assert transforms.parse_heads(" 3, max ,mean,3") == ((3,), ("max", "mean"))
    assert transforms.parse_heads("all") == (None, ()) and transforms.parse_heads(None) == (None, ())
    with pytest.raises(ValueError, match="cannot read head 'median'"):
        transforms.parse_heads("median")
    with pytest.raises(ValueError, match="cannot read head '-1'"):
        transforms.parse_heads("-1")


@pytest.mark.parametrize("spec", ["²", "1,²", "١"])
def test_head_spec_with_non_ascii_digits_is_refused(spec: str) -> None:
    from attnviz.transforms import parse_heads

    with pytest.raises(ValueError, match="cannot read head"):
        parse_heads(spec)
