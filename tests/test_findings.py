"""attnviz.measures.findings: exclusions, strongest links, the pairs summary and its bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz import transforms
from attnviz.example import EXAMPLE
from attnviz.measures import findings, metrics
from attnviz.result import Attention, Provenance
from attnviz.shape import ModelShape
from attnviz.tokens import Tokens, is_punctuation

# 0:[CLS] 1:the 2:cat 3:sat 4:, 5:then 6:it 7:ran 8:[SEP]
CAT = Tokens(
    text="the cat sat, then it ran",
    ids=tuple(range(9)),
    pieces=("[CLS]", "the", "cat", "sat", ",", "then", "it", "ran", "[SEP]"),
    offsets=((0, 0), (0, 3), (4, 7), (8, 11), (11, 12), (13, 17), (18, 20), (21, 24), (0, 0)),
    special=(True, False, False, False, False, False, False, False, True),
)


def make_att(weights: np.ndarray, queries: tuple[int, ...]) -> Attention:
    n, h = weights.shape[:2]
    prov = Provenance("hand", "/nowhere", "bert", "own", "cpu", "float32", ModelShape(n, h, h, False))
    return Attention(tokens=CAT, weights=weights.astype(np.float32), layers=tuple(range(n)), queries=queries,
                     provenance=prov)  # fmt: skip


def test_parse_exclude() -> None:
    assert metrics.parse_exclude("special, adjacent,punct") == ("special", "adjacent", "punct")
    assert metrics.parse_exclude("none") == () and metrics.parse_exclude("") == ()
    with pytest.raises(ValueError, match="the kinds are special, adjacent, punct"):
        metrics.parse_exclude("specials")


def test_excluded_kinds() -> None:
    assert metrics.excluded(CAT, (6,), ("special",)).tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 1]
    assert metrics.excluded(CAT, (6,), ("punct",)).tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert metrics.excluded(CAT, (6,), ("adjacent",)).tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 0]
    assert metrics.excluded(CAT, (2, 3), ("adjacent",)).tolist() == [0, 1, 1, 1, 1, 0, 0, 0, 0]
    assert is_punctuation("'") and is_punctuation("Ġ--".removeprefix("Ġ")) and not is_punctuation("##s")


def test_strongest_links_skip_trivial_targets() -> None:
    w = np.zeros((2, 2, 1, 9))
    w[0, 0, 0, [0, 5]] = [0.9, 0.1]  # a sink head: [CLS]
    w[0, 1, 0, [4, 2]] = [0.8, 0.2]  # punctuation, then cat
    w[1, 0, 0, [7, 2]] = [0.6, 0.4]  # next token, then cat
    w[1, 1, 0, [3, 1]] = [0.5, 0.5]  # sat and the, tied
    links = findings.strongest_links(make_att(w, (6,)), 0, n=4)
    got = [(x.layer, x.head, x.target, round(x.weight, 6)) for x in links]
    assert got == [(1, "h1", "the", 0.5), (1, "h1", "sat", 0.5), (1, "h0", "cat", 0.4), (0, "h1", "cat", 0.2)]
    raw = findings.strongest_links(make_att(w, (6,)), 0, n=1, exclude=())
    assert (raw[0].target, raw[0].weight) == ("[CLS]", pytest.approx(0.9))


def test_the_example_surfaces_the_coreference_heads(own_engine, hf_engine) -> None:
    """With trivial targets set aside, layer 3 head 1 and layer 5 head 11 → 'animal' are
    among the five strongest links of 'it' — computed here from transformers' own weights."""
    import torch

    from .helpers import inspect

    tokens = own_engine.tokenize(EXAMPLE)
    it = tokens.labels.index("it")
    links = findings.strongest_links(inspect(tokens, own_engine, None, (it,)), 0, n=5)
    named = {(x.layer, x.head, x.target) for x in links}
    assert {(3, "h1", "animal"), (5, "h11", "animal")} <= named
    with torch.inference_mode():
        ref = hf_engine.model(input_ids=torch.tensor([tokens.ids]), output_attentions=True).attentions
    skip = {0, len(tokens) - 1, it - 1, it, it + 1, tokens.labels.index("'")}
    expected = sorted(
        ((float(ref[n][0, h, it, s]), n, h, s) for n in range(6) for h in range(12) for s in range(len(tokens))
         if s not in skip),
        reverse=True,
    )[:5]  # fmt: skip
    assert [(x.layer, int(x.head[1:]), x.target_index) for x in links] == [(n, h, s) for _, n, h, s in expected]
    for link, (weight, *_) in zip(links, expected):
        assert link.weight == pytest.approx(weight, abs=1e-5)


def test_links_on_words_name_whole_words() -> None:
    tokens = Tokens(
        text="councilmen met",
        ids=(0, 1, 2, 3, 4),
        pieces=("[CLS]", "council", "##men", "met", "[SEP]"),
        offsets=((0, 0), (0, 7), (7, 10), (11, 14), (0, 0)),
        special=(True, False, False, False, True),
    )
    w = np.zeros((1, 1, 5, 5))
    w[0, 0, :, :] = [0.1, 0.3, 0.3, 0.2, 0.1]
    prov = Provenance("hand", "/nowhere", "bert", "own", "cpu", "float32", ModelShape(1, 1, 1, False))
    att = Attention(tokens=tokens, weights=w.astype(np.float32), layers=(0,), queries=tuple(range(5)), provenance=prov)
    words = transforms.apply(att, transforms.View(words=True), query_groups=[(3,)])
    assert words.query_span(0) == (2,)
    links = findings.strongest_links(words, 0, exclude=("special",))
    assert links[0].target == "councilmen" and links[0].weight == pytest.approx(0.6)


# --- pairs summary -------------------------------------------------------------------------------


def test_bootstrap_against_a_loop() -> None:
    rng = np.random.default_rng(7)
    values = rng.normal(size=(10, 3))
    low, high = findings.bootstrap_mean(values, n_boot=500, level=0.9, seed=3)
    # The same resampling written as a loop.
    draw = np.random.default_rng(3).integers(0, 10, size=(500, 10))
    means = np.array([[values[row, k].mean() for k in range(3)] for row in draw])
    np.testing.assert_allclose(low, np.percentile(means, 5, axis=0))
    np.testing.assert_allclose(high, np.percentile(means, 95, axis=0))
    assert np.all(low <= values.mean(0)) and np.all(values.mean(0) <= high)
    again = findings.bootstrap_mean(values, n_boot=500, level=0.9, seed=3)
    np.testing.assert_array_equal(again, [low, high])


def test_pair_shifts_summary() -> None:
    toward = np.array([[0.4, -0.1], [0.2, 0.1], [0.3, -0.3]])
    shifts = findings.pair_shifts(toward, [(3, "h1"), (0, "h2")], n_boot=200)
    assert [(s.layer, s.head) for s in shifts] == [(3, "h1"), (0, "h2")]
    first = shifts[0]
    assert first.mean == pytest.approx(0.3) and first.moved == 3 and first.pairs == 3
    assert 0.2 - 1e-9 <= first.low <= 0.3 <= first.high <= 0.4 + 1e-9  # within the sample's range
    assert shifts[1].moved == 1
    # Identical pairs: nothing to resample, the interval is the value itself.
    same = findings.pair_shifts(np.full((4, 1), 0.25), [(1, "h0")])
    assert same[0].low == pytest.approx(0.25) and same[0].high == pytest.approx(0.25)


def test_links_of_chosen_heads_only() -> None:
    w = np.zeros((1, 2, 1, 9))
    w[0, 0, 0, 2] = 0.9
    w[0, 1, 0, 3] = 0.4
    links = findings.strongest_links(make_att(w, (6,)), 0, n=2, heads=[1])
    assert [(x.head, x.target) for x in links] == [("h1", "sat")]
