"""Each detector's definition on hand-made attention patterns, and the accumulators'
arithmetic against numpy's mean/std over the same per-text scores."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.corpus.detectors import (
    DETECTORS,
    CorefItem,
    CorefTally,
    DetectorConfig,
    HeadAccumulator,
    TextFeatures,
    coref_hits,
    detector_masks,
    features,
    text_scores,
    top_heads,
)
from attnviz.measures import metrics
from attnviz.tokens import is_punctuation

ALL = DetectorConfig()


def plain(ids: list[int]) -> TextFeatures:
    """A text with no special tokens and no punctuation."""
    return TextFeatures(tuple(ids), (False,) * len(ids), (False,) * len(ids))


def score(pattern: np.ndarray, text: TextFeatures, causal: bool = False, config: DetectorConfig = ALL) -> dict:
    """{detector: score} of a single-head (S, S) pattern for one text; None where undefined."""
    w = np.asarray(pattern, dtype=np.float64)[None, None, None]  # (N=1, B=1, H=1, S, S)
    scores, valid = text_scores(w, [text], causal, config)
    return {d: (float(scores[0, k, 0, 0]) if valid[0, k] else None) for k, d in enumerate(config.detectors)}


def shifted(size: int, offset: int) -> np.ndarray:
    """Row i puts all weight on key i + offset (clamped into the text)."""
    a = np.zeros((size, size))
    for i in range(size):
        a[i, min(max(i + offset, 0), size - 1)] = 1.0
    return a


def test_previous_token_pattern_scores_one_on_previous_and_zero_elsewhere() -> None:
    s = score(shifted(5, -1), plain([10, 11, 12, 13, 14]))
    assert s["previous"] == 1.0
    assert s["next"] == 0.0
    assert s["self"] == pytest.approx(1 / 5)  # only row 0, which has no previous token, looks at itself
    # Local (k=2) covers the previous token, so every query's mass is local.
    assert s["local"] == 1.0
    assert s["entropy"] == 0.0  # one key per row
    assert s["duplicate"] is None and s["induction"] is None  # no repeated ids: undefined


def test_uniform_pattern_hand_worked() -> None:
    # Four tokens, every row uniform over the four keys.
    s = score(np.full((4, 4), 0.25), plain([1, 2, 3, 4]), config=DetectorConfig(local_k=1))
    assert s["previous"] == pytest.approx(0.25)  # queries 1..3 only, each 0.25
    assert s["next"] == pytest.approx(0.25)  # queries 0..2
    assert s["self"] == pytest.approx(0.25)
    # |i - j| <= 1: rows 0 and 3 see 2 keys, rows 1 and 2 see 3: (2 + 3 + 3 + 2) / 4 / 4.
    assert s["local"] == pytest.approx(10 / 16)
    assert s["entropy"] == pytest.approx(1.0)
    # No specials: the first token is the sink; queries 1..3 each put 0.25 on it.
    assert s["sink"] == pytest.approx(0.25)


def test_causal_uniform_pattern_has_entropy_one_and_no_next_token_mass() -> None:
    size = 5
    a = np.tril(np.ones((size, size)))
    a /= a.sum(1, keepdims=True)
    s = score(a, plain([1, 2, 3, 4, 5]), causal=True)
    assert s["entropy"] == pytest.approx(1.0)
    assert s["next"] == 0.0
    # previous: query i puts 1/(i+1) on i-1, for i = 1..4.
    assert s["previous"] == pytest.approx(np.mean([1 / 2, 1 / 3, 1 / 4, 1 / 5]))


def test_entropy_matches_metrics_entropy_on_a_random_causal_pattern() -> None:
    rng = np.random.default_rng(0)
    size = 7
    a = np.tril(rng.random((size, size)))
    a /= a.sum(1, keepdims=True)
    s = score(a, plain(list(range(size))), causal=True)
    mask = np.tril(np.ones((size, size), dtype=bool))
    per_row = metrics.entropy(a, mask)  # (S,)
    # Query 0 sees one key only: not eligible.
    assert s["entropy"] == pytest.approx(per_row[1:].mean(), abs=1e-12)


def test_sink_uses_special_tokens_and_special_queries_are_never_scored() -> None:
    # [CLS] a b c [SEP]: every row on [CLS] except [SEP]'s own row (not a query anyway).
    text = features([101, 7, 8, 9, 102], [True, False, False, False, True], ["[CLS]", "a", "b", "c", "[SEP]"])
    a = np.zeros((5, 5))
    a[:, 0] = 1.0
    a[4] = 0.0
    a[4, 2] = 1.0
    s = score(a, text)
    assert s["sink"] == 1.0
    assert s["self"] == 0.0
    # Query 1's previous token is [CLS]: 1.0; queries 2, 3: 0.
    assert s["previous"] == pytest.approx(1 / 3)
    # Half on [SEP], half on [CLS]: still all sink.
    a2 = np.zeros((5, 5))
    a2[:, 0] = 0.5
    a2[:, 4] = 0.5
    assert score(a2, text)["sink"] == pytest.approx(1.0)


def test_punctuation_detector() -> None:
    labels = ["[CLS]", "Hello", ",", "world", "!", "[SEP]"]
    text = features([1, 2, 3, 4, 5, 6], [True, False, False, False, False, True], labels)
    assert text.punctuation == (False, False, True, False, True, False)
    a = np.zeros((6, 6))
    a[:, 2] = 0.75  # on ","
    a[:, 3] = 0.25
    assert score(a, text)["punctuation"] == pytest.approx(0.75)
    assert is_punctuation("Ġ,") and is_punctuation("...") and is_punctuation("«")
    assert not is_punctuation("a.") and not is_punctuation("") and not is_punctuation("Ġ")


def test_duplicate_and_induction_targets_hand_listed() -> None:
    # ids: 1 2 1 2 1
    queries, targets, _ = detector_masks(plain([1, 2, 1, 2, 1]), 5, False, DetectorConfig(("duplicate", "induction")))
    dup, ind = targets

    def keys(m: np.ndarray, i: int) -> set[int]:
        return set(np.flatnonzero(m[i]).tolist())

    assert [keys(dup, i) for i in range(5)] == [set(), set(), {0}, {1}, {0, 2}]
    # Induction: the token after each earlier copy, strictly before the query.
    assert [keys(ind, i) for i in range(5)] == [set(), set(), {1}, {2}, {1, 3}]
    assert queries.tolist() == [[False, False, True, True, True]] * 2


def test_induction_on_a_sequence_repeated_twice() -> None:
    # BOS, then 5 6 7 8 twice: the classic induction probe.
    ids = [0, 5, 6, 7, 8, 5, 6, 7, 8]
    special = [True] + [False] * 8
    text = TextFeatures(tuple(ids), tuple(special), (False,) * 9)
    half = 4
    induction = np.zeros((9, 9))
    duplicate = np.zeros((9, 9))
    for i in range(9):
        if i > half:  # second half: attend to the token after the previous copy / to the copy
            induction[i, i - half + 1] = 1.0
            duplicate[i, i - half] = 1.0
        else:
            induction[i, 0] = duplicate[i, 0] = 1.0
    s_ind = score(induction, text, causal=True)
    s_dup = score(duplicate, text, causal=True)
    assert s_ind["induction"] == 1.0 and s_ind["duplicate"] == 0.0
    assert s_dup["duplicate"] == 1.0 and s_dup["induction"] == 0.0
    # Of the 8 queries only the first, parked on BOS, happens to look at its previous token.
    assert s_ind["previous"] == pytest.approx(1 / 8)


def test_padding_is_ignored() -> None:
    # The same text alone and padded with 3 garbage positions scores the same.
    rng = np.random.default_rng(1)
    text = features([3, 4, 3, 5], [False] * 4, ["a", ".", "a", "b"])
    a = rng.random((4, 4))
    a /= a.sum(1, keepdims=True)
    padded = rng.random((7, 7))
    padded[:4, :4] = a
    padded[:4, 4:] = 0.0
    alone = score(a, text)
    assert score(padded, text) == pytest.approx(alone, abs=1e-12)


def test_batch_scores_and_accumulator_match_numpy_mean_and_sd() -> None:
    rng = np.random.default_rng(2)
    texts = [plain(list(rng.integers(0, 4, size=n))) for n in (3, 6, 5, 8, 4)]
    size, layers, heads = 8, (0, 3), 2
    w = rng.random((len(layers), len(texts), heads, size, size))
    w /= w.sum(-1, keepdims=True)
    # Per-text scores computed one text at a time, then averaged by numpy.
    singles = [text_scores(w[:, b : b + 1, :, : len(t), : len(t)], [t], False, ALL) for b, t in enumerate(texts)]
    acc = HeadAccumulator.empty(DETECTORS, layers, heads)
    acc = acc.add(*text_scores(w[:, :2], texts[:2], False, ALL)).add(*text_scores(w[:, 2:], texts[2:], False, ALL))
    for d, name in enumerate(DETECTORS):
        vals = np.array([s[0][0, d] for s in singles if s[1][0, d]])  # (n, N, H)
        assert acc.count[d] == len(vals), name
        if len(vals):
            assert acc.mean[d] == pytest.approx(vals.mean(0), abs=1e-12)
        if len(vals) > 1:
            assert acc.sd[d] == pytest.approx(vals.std(0, ddof=1), abs=1e-12)


def test_merge_is_the_same_as_adding_everything_in_one_batch() -> None:
    rng = np.random.default_rng(3)
    scores = rng.random((10, len(DETECTORS), 2, 3))
    valid = rng.random((10, len(DETECTORS))) > 0.3
    empty = HeadAccumulator.empty(DETECTORS, (0, 1), 3)
    whole = empty.add(scores, valid)
    parts = (
        empty.add(scores[:4], valid[:4])
        .merge(empty.add(scores[4:7], valid[4:7]))
        .merge(empty.add(scores[7:], valid[7:]))
    )
    backwards = empty.add(scores[7:], valid[7:]).merge(empty.add(scores[:7], valid[:7]))
    for other in (parts, backwards):
        assert np.array_equal(other.count, whole.count)
        assert np.allclose(other.mean, whole.mean, atol=1e-12)
        assert np.allclose(other.m2, whole.m2, atol=1e-12)
    assert np.array_equal(whole.merge(empty).count, whole.count)
    with pytest.raises(ValueError, match="different heads"):
        whole.merge(HeadAccumulator.empty(DETECTORS, (0,), 3))


def test_rows_and_top_heads() -> None:
    scores = np.zeros((1, len(DETECTORS), 2, 3))
    prev = DETECTORS.index("previous")
    ent = DETECTORS.index("entropy")
    scores[0, prev, 1, 2] = 0.9
    scores[0, prev, 0, 1] = 0.5
    scores[0, ent] = 0.5
    scores[0, ent, 1, 0] = 0.1
    acc = HeadAccumulator.empty(DETECTORS, (4, 5), 3).add(scores, np.ones((1, len(DETECTORS)), dtype=bool))
    best = top_heads(acc, "previous", 2)
    assert [(r.layer, r.head, r.mean) for r in best] == [(5, 2, 0.9), (4, 1, 0.5)]
    assert (top_heads(acc, "entropy", 1)[0].layer, top_heads(acc, "entropy", 1)[0].head) == (5, 0)
    rows = acc.rows()
    assert len(rows) == len(DETECTORS) * 2 * 3
    assert rows[0].to_dict() == {"layer": 4, "head": 0, "detector": "previous", "mean": 0.0, "sd": 0.0, "n": 1}


def test_coreference_hits_and_nearest_baseline() -> None:
    # [CLS] the dog chased the cat until it ran [SEP]
    special = (True,) + (False,) * 8 + (True,)
    item = CorefItem(pronoun=(7,), referent=(2,), candidates=((2,), (5,)), special=special)
    w = np.zeros((1, 3, 10, 10))
    w[0, 0, 7, 0] = 0.6  # mostly [CLS], then dog: correct (specials skipped)
    w[0, 0, 7, 2] = 0.3
    w[0, 0, 7, 5] = 0.1
    w[0, 1, 7, 7] = 0.7  # itself, then cat: wrong (the pronoun is skipped)
    w[0, 1, 7, 5] = 0.2
    w[0, 1, 7, 2] = 0.1
    w[0, 2, 7, 6] = 1.0  # "until": wrong
    assert coref_hits(w, item).tolist() == [[True, False, False]]
    assert not item.nearest_is_referent()  # "cat" is nearer
    tally = CorefTally.empty((0,), 3).add(w, item)
    other = CorefItem(pronoun=(7,), referent=(5,), candidates=((2,), (5,)), special=special)
    tally = tally.merge(CorefTally.empty((0,), 3).add(w, other))
    assert tally.total == 2 and tally.baseline == 0.5
    assert tally.accuracy.tolist() == [[0.5, 0.5, 0.0]]
    with pytest.raises(ValueError, match="referent"):
        CorefItem(pronoun=(7,), referent=(3,), candidates=((2,), (5,)), special=special)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="unknown detector"):
        DetectorConfig(("previous", "bogus"))
    with pytest.raises(ValueError, match="local_k"):
        DetectorConfig(local_k=-1)
