"""attnviz.render.terminal.tables on hand-made rows: colour only when asked, fits narrow terminals."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console

from attnviz.measures.metrics import HeadStats, PairStats
from attnviz.render.terminal.tables import head_rows_table, pair_rows_table

ROW = HeadStats(
    layer=5,
    head=11,
    top=(("animal", 0.65), ("[CLS]", 0.15), ("tired", 0.04)),
    top_index=(2, 0, 13),
    targets={"animal": 0.65, "street": 0.02},
    entropy=0.5,
    sink=0.17,
    self_share=0.03,
    prev=0.01,
    next=0.01,
    distance=7.4,
)
B = dataclasses.replace(
    ROW, targets={"animal": 0.5, "street": 0.04}, top=(("animal", 0.5), ("[CLS]", 0.23), ("street", 0.04))
)
PAIR = PairStats(ROW, B)


def render(renderable: Any, width: int, color: bool) -> str:
    console = Console(record=True, width=width, force_terminal=color, color_system="truecolor" if color else None)
    console.print(renderable)
    return console.export_text(styles=color)


def test_colour_only_when_asked() -> None:
    coloured = render(head_rows_table([ROW], sort_by="weight", color=True), 140, color=True)
    plain = render(head_rows_table([ROW], sort_by="weight", color=False), 140, color=False)
    assert "\x1b[" in coloured and "\x1b[" not in plain
    line = next(line for line in plain.splitlines() if line.lstrip().startswith("5"))
    assert line.split()[:8] == ["5", "11", "animal", "0.65", "[CLS]", "0.15", "tired", "0.04"]
    assert "animal ▼" in plain


def test_narrow_terminal_stacks_or_drops_top_lists() -> None:
    narrow = render(head_rows_table([ROW], width=80, color=False), 80, color=False)
    assert max(len(line.rstrip()) for line in narrow.splitlines()) <= 80
    assert any(line.strip() == "[CLS] 0.15" for line in narrow.splitlines())  # one entry per line
    pair = render(pair_rows_table([PAIR], width=80, color=False), 80, color=False)
    assert "-0.15" in pair and "+0.02" in pair
    # Too narrow beside the changes: the top lists follow in a table of their own (issue 39:
    # they were left out), every entry of A and B there, and no line past 80 columns.
    assert "top targets left out" not in pair and "top A" in pair
    assert max(len(line.rstrip()) for line in pair.splitlines()) <= 80
    below = pair.split("same heads in the same order:")[1]
    for label, weight in (*ROW.top, *B.top):
        assert f"{label} {weight:.2f}" in below, label
    assert below.split()[:6] == ["layer", "head", "top", "A", "top", "B"] and "5   11 animal 0.65" in below
    wide = render(pair_rows_table([PAIR], width=160, color=False), 160, color=False)
    assert "top A" in wide and "animal 0.50  [CLS] 0.23" in wide


def test_pair_headers_say_the_word_as_the_sentence_writes_it() -> None:
    from attnviz.render.terminal.tables import as_written

    text = "Anna thanked Maria because she had received a gift"
    assert as_written(text, "anna") == "Anna" and as_written(text, "maria:1") == "Maria:1"
    assert as_written(text, "gif") == "gif"  # not a word of the text: as given
    lower = dataclasses.replace(ROW, targets={"anna": 0.3})
    pair = render(
        pair_rows_table([PairStats(lower, lower)], width=160, color=False, names={"anna": "Anna"}), 160, False
    )
    assert "Anna A" in pair and "anna A" not in pair
