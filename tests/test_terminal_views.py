"""The terminal views of transformed attention: aligned wrapped blocks, whole labels when
they fit, aggregate rows, words, tokens set aside, the links summary, the pager."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator

import numpy as np
import pytest
from rich.console import Console

from attnviz import transforms
from attnviz.engines import Engine
from attnviz.example import EXAMPLE
from attnviz.measures import findings
from attnviz.render.terminal import for_console, paged, render_show, token_heatmap
from attnviz.render.terminal.shifts import shifts_table
from attnviz.result import Attention

from .helpers import inspect

LONG_WORDS = "The internationalization committee's extraordinarily comprehensive recommendations were ignored"


def text_of(renderable, width: int) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


@pytest.fixture(scope="module")
def att(own_engine: Engine) -> Attention:
    tokens = own_engine.tokenize(EXAMPLE)
    return inspect(tokens, own_engine, None, None)


def _columns(line: str, labels: list[str]) -> dict[str, int]:
    """Where each label's text starts in a header line."""
    return {label: line.index(f" {label} ") + 1 for label in labels if f" {label} " in line}


def test_wrapped_blocks_keep_the_gutter_at_80_columns(att: Attention) -> None:
    it = att.tokens.labels.index("it")
    out = text_of(token_heatmap(att, it, 3, color=False, width=80), 80).splitlines()
    blocks = [i for i, line in enumerate(out) if line.lstrip().startswith("h0 ")]
    assert len(blocks) == 2  # the sentence wraps once at 80 columns
    first_header, second_header = out[blocks[0] - 1], out[blocks[1] - 1]
    # The first token column of each block starts at the same place: the gutter (head
    # names and the strongest column) is as wide in the continuation block.
    start_first = first_header.index("[CLS]")
    start_second = len(second_header) - len(second_header.lstrip())
    assert start_second == start_first
    for line in out[blocks[1] : blocks[1] + 12]:
        name = line[: line.index("h") + 3].strip()
        assert re.fullmatch(r"h\d+", name)
        assert line[len(line) - len(line.lstrip()) + len(name)] == " "  # never 'h3···'
    assert max(len(line) for line in out) <= 80


def test_labels_whole_at_160_columns(own_engine: Engine) -> None:
    tokens = own_engine.tokenize(LONG_WORDS)
    att = inspect(tokens, own_engine, [0], (tokens.labels.index("were"),))
    wide = text_of(token_heatmap(att, att.queries[0], 0, color=False, width=160), 160)
    narrow = text_of(token_heatmap(att, att.queries[0], 0, color=False, width=80), 80)
    long_labels = [label for label in tokens.labels if len(label) > 8]
    assert long_labels
    for label in long_labels:
        assert label in wide
    assert "…" in narrow and "…" not in wide


def test_aggregates_words_and_hidden_specials_in_the_terminal(att: Attention) -> None:
    it = att.tokens.labels.index("it")
    view = transforms.View(words=True, hide_special=True, heads=("mean",), rollout=True)
    out = transforms.apply(att, view, query_groups=[(it,)], layers=[3])
    text = text_of(token_heatmap(out, out.queries[0], 3, color=False, values=True, width=200), 200)
    lines = text.splitlines()
    assert "[CLS]" not in lines[1] and "[SEP]" not in lines[1]  # header: set aside
    mean = next(line for line in lines if line.strip().startswith("mean "))
    rollout = next(line for line in lines if line.strip().startswith("rollout "))
    slot_mean, slot_roll = out.model_heads, out.model_heads + 1
    best = int(np.argmax(out.weights[0, slot_mean, 0]))
    assert f"{out.tokens.labels[best]} {out.weights[0, slot_mean, 0, best]:.2f}" in mean
    assert f"{out.weights[0, slot_roll, 0].max():.2f}".lstrip("0") in rollout
    assert "'it' (word" in lines[0]


def test_render_show_states_the_steps_and_the_links(att: Attention) -> None:
    it = att.tokens.labels.index("it")
    out = transforms.apply(att, transforms.View(hide_special=True), query_groups=[(it,)])
    console = Console(width=120, record=True, color_system=None, file=io.StringIO())
    console.print(render_show(out, out.queries, **for_console(console)))
    text = console.export_text()
    assert "specials set aside: weight 0 as keys, rows renormalised over the rest" in text
    links = findings.strongest_links(out, 0)
    assert f"layer {links[0].layer} head {links[0].head[1:]}" in text.split("strongest links of 'it'")[1]


def test_split_word_title_names_its_pieces(own_engine: Engine) -> None:
    tokens = own_engine.tokenize("The councilmen met")
    pieces = (tokens.labels.index("council"), tokens.labels.index("##men"))
    out = transforms.apply(inspect(tokens, own_engine, [0], pieces), transforms.View(), query_groups=[pieces])
    text = text_of(token_heatmap(out, out.queries[0], 0, color=False, width=120), 120)
    assert f"'council ##men' (tokens {pieces[0]}-{pieces[1]}, averaged)" in text


class _PagerSpy:
    def __init__(self) -> None:
        self.entered = 0

    @contextlib.contextmanager
    def __call__(self, *args: object, **kwargs: object) -> Iterator[None]:
        self.entered += 1
        yield


@pytest.mark.parametrize(("terminal", "enabled", "used"), [(True, True, 1), (True, False, 0), (False, True, 0)])
def test_pager_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, terminal: bool, enabled: bool, used: int) -> None:
    console = Console(force_terminal=terminal, file=io.StringIO())
    spy = _PagerSpy()
    monkeypatch.setattr(console, "pager", spy)
    monkeypatch.delenv("LESS", raising=False)
    with paged(console, enabled):
        console.print("hello")
    assert spy.entered == used
    if used:
        import os

        assert os.environ["LESS"] == "FRX"


def test_shifts_table() -> None:
    shifts = findings.pair_shifts(np.array([[0.3, -0.1], [0.1, 0.2]]), [(3, "h1"), (0, "h2")], n_boot=100)
    text = text_of(shifts_table(shifts, color=False), 100)
    first = next(line for line in text.splitlines() if line.strip().startswith("3"))
    assert first.split()[:4] == ["3", "h1", "+0.20", "2/2"]
    assert "95% interval" in text
