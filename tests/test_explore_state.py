"""The explorer's session (tui.state) without a screen: what each key does to the cursor,
the reading and the measure, checked against the weights, with no textual app running."""

from __future__ import annotations

import pytest

from attnviz.engines import Engine
from attnviz.errors import UsageError
from attnviz.example import EXAMPLE
from attnviz.result import Attention
from attnviz.tui.state import Session
from attnviz.tui.views import VIEWS, Cursor

from .helpers import inspect


@pytest.fixture(scope="module")
def att(own_engine: Engine) -> Attention:
    """The example through the packaged MiniLM (6 layers × 12 heads), every query row."""
    return inspect(EXAMPLE, own_engine)


def test_moves_wrap_around_tokens_layers_heads_and_views(att: Attention) -> None:
    s = Session(att, query=0)
    assert s.cursor == Cursor("heads", 0, 0, 0)
    s.step_query(-1)
    s.step_layer(-1)
    s.step_head(-1)
    assert s.cursor == Cursor("heads", 5, 11, len(att.tokens) - 1)
    for view in (*VIEWS[1:], VIEWS[0]):
        s.next_view()
        assert s.cursor.view == view
    assert s.show_view("matrix") is None and s.cursor.view == "matrix"
    s.toggle_values()
    assert s.cursor.values and "values" in s.status().plain


def test_a_reading_key_keeps_the_token_and_is_named_in_the_status(att: Attention) -> None:
    it = att.tokens.labels.index("it")
    s = Session(att, query=it)
    s.step_head(3)
    s.toggle_reading("words")
    assert s.att.key_pieces is not None and s.att.tokens.labels[s.cursor.query] == "it"
    assert s.cursor.head == 3 and "words" in s.status().plain
    s.toggle_reading("words")
    assert s.cursor.query == it and s.att.key_pieces is None


def test_the_measure_says_why_it_cannot_change(att: Attention) -> None:
    s = Session(att)
    assert s.toggle_measure() == "this explorer has no model to compute the norms with"
    assert s.measure == "weight"

    def refuse(text: object) -> Attention:
        raise UsageError("no norms here", hint="try another model")

    s = Session(att, run_norms=refuse)
    assert s.toggle_measure() == "error: no norms here (try another model)"
    assert s.measure == "weight" and s.att.measure == "weight"


def test_a_short_texts_neighbours_are_one_key_away(att: Attention) -> None:
    s = Session(att, query=3)
    near = s.neighbours(s.cursor)
    assert all(option == "" for option, _ in near)
    assert len(near) == 6 + len(VIEWS) - 1 + 1  # ← → ↑ ↓ [ ], the other views, n
    assert s.one_key_away("", near[0][1]) == (s.views, near[0][1])


def test_a_query_out_of_range_is_refused(att: Attention) -> None:
    with pytest.raises(ValueError, match="out of range"):
        Session(att, query=len(att.tokens))
