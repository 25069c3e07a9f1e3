"""The explorer's data side: the cursor (query, layer, head, view), the drawn views of one
``Attention`` kept in memory, and the helpers that check, name and export a view.

A view is drawn into lines of segments once and looked up after (``DrawnViews``); the
session (tui.state) only moves the cursor and the app (tui.app) copies lines to the screen.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.strip import Strip

from ..errors import Reason, UsageError
from ..measures.base import MEASURES
from ..measures.metrics import HeadStats, head_stats
from ..render.terminal import legend, matrix_heatmap, token_heatmap
from ..render.terminal.tables import head_rows_table
from ..result import Attention
from ..tokens import Tokens
from ..transforms import View, measure_label

if TYPE_CHECKING:
    pass


VIEWS = ("heads", "table", "matrix")
VIEW_TITLES = {"heads": "token heatmap", "table": "head table", "matrix": "matrix of one head"}

MAX_BYTES = 2**30  # the full matrices kept in memory: 1 GiB (MiniLM, 512 tokens: 72 MiB)
_CACHE_SIZE = 512  # drawn views kept; one is a few kB of segments


@dataclass(frozen=True)
class Cursor:
    """What the screen shows: a view of one query token, layer and head."""

    view: str
    layer: int  # model layer (0-based), one of Attention.layers
    head: int  # 0-based
    query: int  # token position
    values: bool = False  # numbers in the cells

    def __post_init__(self) -> None:
        if self.view not in VIEWS:
            raise ValueError(f"unknown view {self.view!r}; views are {', '.join(VIEWS)}")


def check_size(num_layers: int, num_heads: int, num_tokens: int, budget: int = MAX_BYTES) -> None:
    """The explorer keeps every layer's full matrices (4 bytes a weight); refuse before
    the forward pass when they would not fit ``budget`` bytes.

    Raises:
        UsageError: the matrices would take more than ``budget`` bytes.
    """
    size = 4 * num_layers * num_heads * num_tokens * num_tokens
    if size > budget:
        raise UsageError(
            f"{num_layers} layers × {num_heads} heads × {num_tokens}² tokens of weights take "
            f"{_bytes(size)}, over the explorer's {_bytes(budget)}",
            hint="explore fewer layers or a shorter sentence",
            reason=Reason.EXPLORE_SIZE,
        )


def _bytes(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def first_query(att: Attention) -> int:
    """The first token the tokenizer did not add (position 0 if all are special)."""
    return next((i for i, special in enumerate(att.tokens.special) if not special), 0)


def landing(cursor: Cursor, old: Attention, new: Attention) -> Cursor:
    """Where the cursor goes on a new sentence: the same word if the new sentence has it
    (else its first real token), the same layer and head where they exist."""
    word = old.tokens.labels[cursor.query]
    labels = new.tokens.labels
    query = labels.index(word) if word in labels else first_query(new)
    layer = cursor.layer if cursor.layer in new.layers else new.layers[0]
    return replace(cursor, query=query, layer=layer, head=min(cursor.head, new.num_heads - 1))


def raw_position(att: Attention, position: int) -> int:
    """The engine's token position of ``position`` in ``att`` (a word: its first piece)."""
    return att.key_pieces[position][0] if att.key_pieces is not None else position


def position_of(att: Attention, raw: int) -> int:
    """Where the engine's token ``raw`` sits in ``att`` (words merged: its word)."""
    if att.key_pieces is None:
        return raw
    return next(w for w, pieces in enumerate(att.key_pieces) if raw in pieces)


def landed(cursor: Cursor, old: Attention, new: Attention) -> Cursor:
    """``cursor`` (on ``old``) on ``new``, another reading of the same text: the same
    token (its word, or a word's first piece) and head."""
    raw = raw_position(old, cursor.query)
    return replace(cursor, query=position_of(new, raw), head=min(cursor.head, new.num_heads - 1))


def toggled(reading: View, measure: str, option: str) -> tuple[View, str]:
    """The reading and measure after the key of ``option``: "words" (w), "hide_special"
    (s), "heads" (m, the head mean) or "measure" (o)."""
    if option == "words":
        return replace(reading, words=not reading.words), measure
    if option == "hide_special":
        return replace(reading, hide_special=not reading.hide_special), measure
    if option == "heads":
        return replace(reading, heads=() if reading.heads else ("mean",)), measure
    names = list(MEASURES)  # o steps through the measures, the weights first
    return reading, names[(names.index(measure) + 1) % len(names)]


def token_line(tokens: Tokens, query: int, reach: int | None = None) -> Text:
    """The tokens, ``query``'s bracketed; ``reach``: only that many each side of it."""
    line = Text()
    labels = tokens.labels
    first, last = 0, len(labels)
    if reach is not None:
        first, last = max(0, query - reach), min(len(labels), query + reach + 1)
        if first:
            line.append(f"… ({first:,} before) ", style="dim")
    for i in range(first, last):
        if i > first:
            line.append(" ")
        if i == query:
            line.append(f"[{labels[i]}]", style="bold reverse")
        else:
            line.append(labels[i], style="dim" if tokens.special[i] else "")
    if last < len(labels):
        line.append(f" … ({len(labels) - last:,} after)", style="dim")
    return line


def export_name(cursor: Cursor, att: Attention) -> str:
    """'attnviz-matrix-layer3-h1-it.png': what the file holds, and where it was taken."""
    kind = "matrix" if cursor.view == "matrix" else "token"
    token = re.sub(r"\W+", "", att.tokens.labels[cursor.query])[:20] or f"t{cursor.query}"
    slot = f"h{cursor.head}" if cursor.head < att.model_heads else att.head_name(cursor.head)  # 'mean'
    head = f"-{slot}" if kind == "matrix" else ""
    return f"attnviz-{kind}-layer{cursor.layer}{head}-{token}.png"


def free_path(directory: Path, name: str) -> Path:
    """``directory / name``, or name-2, name-3, ... if it exists: an export never replaces a file."""
    path = directory / name
    n = 2
    while path.exists():
        path = directory / f"{Path(name).stem}-{n}{Path(name).suffix}"
        n += 1
    return path


def write_view_png(att: Attention, cursor: Cursor, path: Path, dpi: int) -> None:
    """Draw ``cursor``'s view with render.image and write it atomically to ``path``.

    The token heatmap and the head table both export the layer's heads × tokens panel
    for the query token; the matrix view exports the selected head's matrix with the
    query row outlined.
    """
    from ..render import FigureStyle
    from ..render.image import matrix_figure, save_figure, token_figure  # matplotlib: only on export

    if cursor.view == "matrix":
        if cursor.head < att.model_heads:
            fig = matrix_figure(att, cursor.layer, highlight=(cursor.query,), style=FigureStyle(heads=(cursor.head,)))
        else:  # an aggregate slot (the head mean) alone: the only slot, so no model head is drawn
            k = cursor.head - att.model_heads
            alone = replace(att, weights=att.weights[:, cursor.head : cursor.head + 1], aggregates=(att.aggregates[k],))
            fig = matrix_figure(alone, cursor.layer, highlight=(cursor.query,))
    else:
        fig = token_figure(att, cursor.query, (cursor.layer,))
    save_figure(fig, path, dpi)


def _drawn_as(cursor: Cursor) -> Cursor:
    """The cursor that draws the same lines: the head table prints numbers either way."""
    return replace(cursor, values=False) if cursor.view == "table" else cursor


class DrawnViews:
    """The drawn views of one ``Attention``, computed on first use and kept.

    A view is drawn once into lines of segments (``render``), so showing it again is a
    lookup: textual re-measures and re-renders a rich Table on every repaint (measured
    ~70 ms a key for the 12 × 14 heatmap on a busy 2-core machine), lines it only copies.
    ``head_rows(query)`` (``HeadStats`` of every layer and head for one query token) is
    computed once per token.
    """

    def __init__(self, att: Attention) -> None:
        if att.queries != tuple(range(len(att.tokens))):
            raise ValueError("the explorer needs every query row: run the sentence with queries=None")
        self.att = att
        self._rows: dict[int, list[HeadStats]] = {}
        self._drawn: OrderedDict[tuple[Any, ...], list[Strip]] = OrderedDict()
        self._lock = threading.Lock()  # a worker thread may draw while the app reads

    def head_rows(self, query: int) -> list[HeadStats]:
        """metrics.head_stats's rows (every kept layer and head) for ``query``."""
        with self._lock:
            if query not in self._rows:
                self._rows[query] = head_stats(self.att, query)
            return self._rows[query]

    def has(self, cursor: Cursor, width: int, color: bool) -> bool:
        """Whether ``cursor``'s view is drawn for this width and colour."""
        with self._lock:
            return (_drawn_as(cursor), width, color) in self._drawn

    def render(self, cursor: Cursor, width: int, color: bool) -> list[Strip]:
        """The lines of ``cursor``'s view laid out for ``width`` columns."""
        key = (_drawn_as(cursor), width, color)
        return drawn_once(self._drawn, self._lock, key, lambda: strips(self.renderable(cursor, width, color), width))

    def renderable(self, c: Cursor, width: int, color: bool) -> RenderableType:
        """``c``'s view as a rich renderable (from the shared terminal renderers)."""
        att = self.att
        if c.view == "heads":
            return Group(
                token_heatmap(att, c.query, c.layer, values=c.values, color=color, width=width, selected=c.head),
                legend(color, measure_label(att)),
            )
        if c.view == "matrix":
            return matrix_heatmap(att, c.layer, c.head, query=c.query, values=c.values, color=color, width=width)
        return self._table(c, width, color)

    def _table(self, c: Cursor, width: int, color: bool) -> RenderableType:
        return head_table(self.att, self.head_rows(c.query), c, width, color)


def head_table(att: Attention, stats: list[HeadStats], c: Cursor, width: int, color: bool) -> RenderableType:
    """The head table of ``c``'s layer: one line per model head with where the query
    token attends (``stats``: metrics.head_stats of the query), the selected head reversed."""
    p = att.provenance
    # The model's heads (an aggregate slot has no line in compare's table).
    heads = att.model_heads
    rows = [row for row in stats if row.layer == c.layer and row.head < heads]
    table = head_rows_table(rows, color=color, num_heads=p.num_heads, num_kv_heads=p.num_kv_heads, width=width)
    if isinstance(table, Table) and c.head < heads:  # (untitled: a Table) the selected head's line
        table.rows[c.head].style = "reverse"
    title = Text(f"layer {c.layer} · {att.tokens.labels[c.query]!r} (token {c.query}) → each token, per head")
    note = Text(
        "top 3: largest weights · entropy: 0 = one token, 1 = uniform · sink: share on special tokens · "
        "self/prev/next: share on the token, the one before, the one after · dist: mean distance in tokens",
        style="dim",
    )
    return Group(title, table, Text(""), note)


def drawn_once(
    drawn: OrderedDict[Any, list[Strip]], lock: threading.Lock, key: Any, draw: Callable[[], list[Strip]]
) -> list[Strip]:
    """``drawn[key]``, or ``draw()`` kept there (outside the lock: drawing is the slow part);
    at most ``_CACHE_SIZE`` views kept, the least recently shown dropped first."""
    with lock:
        if key in drawn:
            drawn.move_to_end(key)
            return drawn[key]
    lines = draw()
    with lock:
        drawn[key] = lines
        while len(drawn) > _CACHE_SIZE:
            drawn.popitem(last=False)
    return lines


def line_strip(style: str, runs: Sequence[tuple[str, Style | str]], width: int) -> Strip | None:
    """One line of rich ``Text`` given as its style and runs (each with the style of a span
    over it, "" for none), drawn into the segments ``strips`` would draw it into, without
    rich's layout: None when it would not fit ``width`` (rich would wrap it) or holds a
    line break. Like rich's ``Text.render``: unstyled runs side by side are one segment,
    a span's segment has the line's style combined with the span's, control codes go."""
    plain, base = Style(), Style.parse(style) if style else Style.null()
    out: list[Segment] = []
    loose = ""  # unstyled text not yet made a segment
    for text, span in runs:
        text = strip_control_codes(text)
        if not text:
            continue
        if not span:
            loose += text
            continue
        if loose:
            out.append(Segment(loose, base or plain))
            loose = ""
        out.append(Segment(text, (base + (span if isinstance(span, Style) else Style.parse(span))) or plain))
    if loose:
        out.append(Segment(loose, base or plain))
    line = "".join(segment.text for segment in out)
    if "\n" in line or "\t" in line or cell_len(line) > width:
        return None
    return Strip(out)


def strips(renderable: RenderableType, width: int) -> list[Strip]:
    """``renderable`` drawn once into lines of segments at ``width`` columns."""
    console = Console(
        width=width, color_system="truecolor", force_terminal=True, highlight=False, emoji=False, no_color=False
    )
    lines = console.render_lines(renderable, console.options, pad=False)
    plain = Style()  # every segment gets a Style: textual's NO_COLOR filter reads .color of each one
    return [Strip([Segment(text, style or plain, ctl) for text, style, ctl in line]) for line in lines]
