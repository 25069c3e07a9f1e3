"""The select stage: queries, layers and targets, checked before any model work."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from attnviz.errors import LayerError, TokenNotFoundError, UsageError
from attnviz.select import Query, find_targets, parse_layers, parse_target
from attnviz.tokens import Tokens


def tokens_of(text: str) -> Tokens:
    """Whitespace tokens with [CLS]/[SEP], offsets from the text (no model needed)."""
    words, offsets, pos = [], [], 0
    for word in text.split():
        start = text.index(word, pos)
        words.append(word)
        offsets.append((start, start + len(word)))
        pos = start + len(word)
    n = len(words) + 2
    return Tokens(
        text=text,
        ids=tuple(range(n)),
        pieces=("[CLS]", *words, "[SEP]"),
        offsets=((0, 0), *offsets, (0, 0)),
        special=(True, *([False] * len(words)), True),
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, (0, 1, 2, 3, 4, 5)),
        ("all", (0, 1, 2, 3, 4, 5)),
        ("3", (3,)),
        (2, (2,)),
        ("-1", (5,)),
        ("1,3", (1, 3)),
        ("2-4", (2, 3, 4)),
        ("4, 4, 0", (4, 0)),
        ([0, 5], (0, 5)),
        ("-2--1", (4, 5)),
        ("0-5,2", (0, 1, 2, 3, 4, 5)),
    ],
)
def test_parse_layers(spec, expected) -> None:
    assert parse_layers(spec, 6) == expected


@pytest.mark.parametrize("spec", ["6", "-7", "x", "1-9", "1.5", "3-1", "-1-0"])
def test_parse_layers_rejects(spec: str) -> None:
    with pytest.raises(LayerError) as info:
        parse_layers(spec, 6)
    assert info.value.facts["num_layers"] == 6
    assert "--" not in info.value.message  # the library names no flag


def test_a_reversed_range_says_so() -> None:
    with pytest.raises(LayerError, match="runs backwards"):
        parse_layers("3-1", 6)


def test_a_huge_range_is_refused_by_arithmetic_not_by_building_it() -> None:
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(LayerError, match="out of range"):
        parse_layers("0-200000000", 6)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000 and time.perf_counter() - start < 1.0
    with pytest.raises(LayerError, match="characters long"):
        parse_layers("1," * 100_000, 6)


def test_query_rules() -> None:
    assert Query("it").word == "it" and Query(index=-1).index == -1
    for kwargs, reason in [
        ({"word": "it", "index": 2}, "word_and_index"),
        ({}, "no_query"),
        ({"index": 2, "occurrence": 1}, "occ_index"),
        ({"word": "it", "occurrence": 0}, "occ_range"),
        ({"word": "  "}, "empty_word"),
    ]:
        with pytest.raises(UsageError) as info:
            Query(**kwargs)
        assert info.value.facts["reason"] == reason
    assert Query.maybe() is None
    with pytest.raises(UsageError):
        Query.maybe(occurrence=2)


def test_query_positions_are_whole_numbers() -> None:
    """index=1.5 and index=True were taken as positions (issue 38): refused with reason
    "type"; numpy's integers are whole numbers and come out as int."""
    import numpy as np

    for kwargs in ({"index": 1.5}, {"index": True}, {"index": 2.0}, {"index": "2"}, {"word": "it", "occurrence": 1.5}):
        with pytest.raises(UsageError, match="must be a whole number") as info:
            Query(**kwargs)  # type: ignore[arg-type]
        assert info.value.facts["reason"] == "type"
    picked = Query(index=np.int64(-2))  # type: ignore[arg-type]
    assert picked.index == -2 and type(picked.index) is int
    assert Query("it", np.int32(2)).occurrence == 2  # type: ignore[arg-type]


@pytest.mark.parametrize("call", ["inspect", "ablate", "explain", "patch", "attribute"])
def test_every_api_function_refuses_a_fractional_index(call: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Refused before any model is looked for: the model path does not exist."""
    import attnviz

    missing = str(tmp_path / "no-model")
    args: dict[str, object] = {"index": 1.5, "model": missing}
    if call == "explain":
        args.update(layer=0, head=0)
    if call == "attribute":
        args.update(answer=" x", wrong=" y")
    texts = ("a b c", "a b d") if call == "patch" else ("a b c",)
    with pytest.raises(UsageError, match="whole number|must be an int"):
        getattr(attnviz, call)(*texts, **args)


def test_query_resolves_against_tokens() -> None:
    toks = tokens_of("the cat saw the dog")
    assert Query("cat").resolve(toks) == (2,)
    assert Query("the", 2).resolve(toks) == (4,)
    assert Query(index=-1).resolve(toks) == (6,)
    with pytest.raises(TokenNotFoundError) as info:
        Query("the").resolve(toks)
    assert info.value.facts == {"reason": "ambiguous", "count": 2}
    with pytest.raises(TokenNotFoundError, match="not in sentence B") as missing:
        Query("bird").resolve(toks, where="sentence B")
    assert missing.value.facts["reason"] == "missing"
    with pytest.raises(TokenNotFoundError) as index:
        Query(index=7).resolve(toks)
    assert index.value.facts == {"reason": "index", "count": 7}


def test_targets() -> None:
    toks = tokens_of("the cat saw the dog")
    assert find_targets(toks, ["the", "the:2", "dog"]) == {"the": (1, 4), "the:2": (4,), "dog": (5,)}
    assert parse_target("the:2") == ("the", 2)
    with pytest.raises(UsageError):
        parse_target("the:0")
    with pytest.raises(TokenNotFoundError, match="target 'bird' is not in the sentence"):
        find_targets(toks, ["bird"])
    with pytest.raises(TokenNotFoundError, match="out of range"):
        find_targets(toks, ["dog:2"])


def test_an_empty_layer_list_is_refused_not_an_internal_error() -> None:
    """inspect(text, layers=[]) reached max([]) in the engine: a ValueError, not ours."""
    from attnviz.errors import LayerError
    from attnviz.select import parse_layers

    with pytest.raises(LayerError, match="no layer"):
        parse_layers([], 6)
    with pytest.raises(LayerError, match="no layer"):
        parse_layers((), 6)
