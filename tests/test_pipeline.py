"""The one road from text to attention: the plan finds every mistake before the forward
pass, and the Reading says where each query and target sits after the reading options."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from attnviz.errors import UsageError
from attnviz.example import EXAMPLE
from attnviz.pipeline import Selection, plan, read, run
from attnviz.select import Query
from attnviz.transforms import View, apply, positions_in

from .helpers import inspect


def test_selection_resolves_everything_at_once(own_engine: Any) -> None:
    toks = own_engine.tokenize("the cat saw the dog")
    resolved = plan(toks, own_engine, Selection((Query("cat"),), "1-2", ("dog",)))
    assert resolved.queries == ((2,),) and resolved.layers == (1, 2) and resolved.targets == {"dog": (5,)}
    assert plan(toks, own_engine, Selection()).queries == ()  # no query: every token's rows
    with pytest.raises(UsageError):
        Selection(targets=("dog:0",))  # a target's form is checked on construction


def test_plan_refuses_before_the_forward_pass(own_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(own_engine, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(UsageError, match="head 12 is out of range") as err:
        run(EXAMPLE, own_engine, Selection(heads=(12,)))
    assert err.value.facts["reason"] == "head" and err.value.facts["num_heads"] == 12
    with pytest.raises(UsageError, match="share token") as err:
        run(EXAMPLE, own_engine, Selection(queries=(Query("it"), Query(index=10))))
    assert err.value.facts["reason"] == "overlap"
    assert calls == []


def test_reading_maps_queries_and_targets_through_words(own_engine: Any) -> None:
    """With --words the reading's positions are words, and "didn't" (three words) sits at its first."""
    view = View(words=True, hide_special=True)
    selection = Selection(queries=(Query("it"), Query("didn't")), layers="3", targets=("animal",), view=view)
    reading = run(EXAMPLE, own_engine, selection)
    att = reading.attention
    assert [att.tokens.labels[q] for q in reading.queries] == ["it", "didn"]  # a query of 3 words: at its first
    assert all(q in att.queries for q in reading.queries)
    assert [att.keys.labels[p] for p in reading.targets["animal"]] == ["animal"]
    # The same numbers as the transforms applied by hand to the raw rows.
    tokens = own_engine.tokenize(EXAMPLE)
    groups = [(10,), (3, 4, 5)]
    raw = inspect(tokens, own_engine, [3], (3, 4, 5, 10))
    by_hand = apply(raw, view, groups, [3])
    np.testing.assert_array_equal(att.weights, by_hand.weights)
    assert reading.queries == tuple(positions_in(by_hand, g)[0] for g in groups)


def test_all_rows_keeps_every_row_and_locates_the_query(own_engine: Any) -> None:
    planned = plan(EXAMPLE, own_engine, Selection(queries=(Query("didn't"),), layers="0", all_rows=True))
    reading = read(planned, own_engine)
    s = len(planned.tokens)
    assert reading.attention.weights.shape == (1, 12, s, s)
    assert reading.queries == (3,) and reading.query_groups == ((3, 4, 5),)  # its first piece, and all three
    np.testing.assert_array_equal(reading.attention.weights, inspect(EXAMPLE, own_engine, [0]).weights)


def test_no_query_means_every_row(own_engine: Any) -> None:
    reading = run(EXAMPLE, own_engine, Selection(layers="1"))
    assert reading.queries == reading.attention.queries == tuple(range(len(reading.attention.tokens)))
