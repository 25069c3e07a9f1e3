"""The explorer on a long text: the full matrices would not fit ``views.MAX_BYTES``, so the
explorer holds the rows of a few query tokens at a time, from the row path, and draws what
``attnviz show`` draws for one token of a long text.

Rows come in windows of ``ROW_WINDOW`` query tokens from a callable the explorer is handed
(``attnviz.cli.exploring.RowSource``; never an engine). Its first window's forward pass
keeps every layer's q and k (attnviz.nn.keptrows), so later windows, and their norms, are
computed from them without another pass; where they cannot be kept (another engine, score
modifiers, over the budget) each window is a forward pass. Windows are fetched in a worker
thread, and the neighbouring windows are fetched ahead while the user reads.

The reading options work on rows as the CLI's do, through the same functions
(``transforms.apply`` on the rows of the cursor's word, then ``shares`` for the norms):
``w`` words (``show --words``), ``s`` special tokens set aside (``--hide-special``), ``m``
the head mean (``--heads mean``), ``o`` the norm measure (``--measure norm``). Views:

- ``heads``: the compact rows of ``show`` on a long text (render.terminal.compact): per head its
  strongest keys and a binned strip of the whole row; ``n`` names as many strongest keys
  as fit (``show --top-keys K``);
- ``table``: the head table (metrics.head_stats needs the query's rows only);
- ``matrix``: refused with a line: it needs every query row of a head.

A view draws one layer, so it reads one (``layer_rows``: the reading steps act on each
layer alone), and its head lines are turned into segments here (``compact_strips``), not
by rich's layout: at 8,192 tokens on the bench decoder a first view went from 70 ms of
CPU (words: 310 ms; 32 layers read, rich laying out 33 lines of ~60 spans) to ~20 ms
(words ~25 ms). The app draws the reading keys' views ahead too (tui.app), and fetches the
cursor's rows in the other measure alone for ``o`` (``fetch(..., alone=True)``, an eighth
of a window).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Group
from rich.text import Text
from textual.strip import Strip

from ..errors import Reason, UsageError
from ..measures.metrics import head_stats
from ..render.terminal import legend
from ..render.terminal.compact import CompactLayer, compact_layer
from ..result import Attention
from ..transforms import View, apply, measure_label, select, shares, word_groups
from .views import MAX_BYTES, Cursor, _bytes, drawn_once, head_table, line_strip, strips

if TYPE_CHECKING:
    pass

ROW_WINDOW = 8  # query tokens whose rows one fetch computes: the token keys then hit the cache
LONG_VIEWS = ("heads", "table")  # the views that work on rows; v cycles over these
LONG_TITLES = {"heads": "compact rows", "table": "head table", "matrix": "matrix of one head"}
_READS = 4  # read rows kept (a 32-layer × 32-head row at 8,192 tokens is 33 MiB)
_LAYER_READS = 64  # one layer's read rows kept, of any reading (1 MiB each there)


def check_rows_size(num_layers: int, num_heads: int, num_tokens: int, budget: int = MAX_BYTES) -> None:
    """The rows of one window of query tokens (4 bytes a weight) must fit ``budget``.

    Raises:
        UsageError: ``ROW_WINDOW`` tokens' rows would take more than ``budget`` bytes.
    """
    size = 4 * num_layers * num_heads * num_tokens * ROW_WINDOW
    if size > budget:
        raise UsageError(
            f"{num_layers} layers × {num_heads} heads × {num_tokens} tokens × {ROW_WINDOW} query rows take "
            f"{_bytes(size)}, over the explorer's {_bytes(budget)}",
            hint="explore fewer layers or a shorter text",
            reason=Reason.EXPLORE_SIZE,
        )


def window_of(query: int, num_tokens: int) -> tuple[int, ...]:
    """The ``ROW_WINDOW`` aligned query positions whose rows are computed with ``query``'s."""
    start = query - query % ROW_WINDOW
    return tuple(range(start, min(start + ROW_WINDOW, num_tokens)))


def window_for(pieces: tuple[int, ...], num_tokens: int) -> tuple[int, ...]:
    """``window_of`` the first piece, widened to every piece (a word across a window's edge)."""
    return tuple(sorted({*window_of(pieces[0], num_tokens), *pieces}))


class _Windows:
    """Computed windows of raw rows per measure, up to ``keep`` of them (least recently
    used dropped first, never the one asked to stay); and per measure the rows of one
    query fetched alone (``add_alone``: the other measure's, fetched ahead of ``o``, an
    eighth of a window), kept until the next one of that measure. Beside them, one layer's
    read rows (``LongViews.layer_rows``) of any reading, the last ``_LAYER_READS``."""

    def __init__(self, keep: int) -> None:
        self.keep = max(2, keep)
        self._rows: OrderedDict[tuple[str, tuple[int, ...]], Attention] = OrderedDict()
        self._alone: dict[str, Attention] = {}
        self._reads: OrderedDict[tuple[Any, ...], Attention] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, key: tuple[Any, ...]) -> Attention | None:
        with self._lock:
            if key in self._reads:
                self._reads.move_to_end(key)
            return self._reads.get(key)

    def keep_read(self, key: tuple[Any, ...], att: Attention) -> None:
        with self._lock:
            self._reads[key] = att
            while len(self._reads) > _LAYER_READS:
                self._reads.popitem(last=False)

    def find(self, measure: str, pieces: tuple[int, ...]) -> Attention | None:
        with self._lock:
            for key in reversed(self._rows):
                if key[0] == measure and set(pieces) <= set(key[1]):
                    self._rows.move_to_end(key)
                    return self._rows[key]
            alone = self._alone.get(measure)
        return alone if alone is not None and set(pieces) <= set(alone.queries) else None

    def held(self, measure: str, pieces: tuple[int, ...]) -> bool:
        """Whether ``pieces`` are in a computed window of ``measure`` (not a query alone)."""
        with self._lock:
            return any(key[0] == measure and set(pieces) <= set(key[1]) for key in self._rows)

    def add_alone(self, measure: str, att: Attention) -> None:
        with self._lock:
            self._alone[measure] = att

    def last(self) -> Attention:
        """The window used last (any measure)."""
        with self._lock:
            return next(reversed(self._rows.values()))

    def room(self, measure: str, beside: list[tuple[int, ...]]) -> bool:
        """Whether one more window fits without dropping any of ``beside`` (the cursor's
        window and its neighbours: fetching one must not push out another, or the
        fetches ahead would go round for ever)."""
        with self._lock:
            if len(self._rows) < self.keep:
                return True
            near = [set(w) for w in beside]
            return any(key[0] != measure or not any(set(key[1]) & w for w in near) for key in self._rows)

    def add(self, measure: str, window: tuple[int, ...], att: Attention, stay: tuple[int, ...] = ()) -> None:
        with self._lock:
            self._rows[(measure, window)] = att
            for key in list(self._rows):
                if len(self._rows) <= self.keep:
                    break
                if key != (measure, window) and not (key[0] == measure and set(stay) <= set(key[1])):
                    del self._rows[key]


class LongViews:
    """The views of a long text read with ``reading`` and ``measure``, drawn from rows.

    ``first``: the raw rows of at least one window; ``rows``: any ``rows(queries, measure)``
    (``attnviz.cli.exploring.RowSource``). ``att`` is the text as the views see it (words merged
    when ``reading.words``: its tokens are then words), for the cursor and the status line.
    ``with_options`` gives the views of other options over the same computed windows.
    """

    def __init__(
        self,
        first: Attention,
        rows: Callable[..., Attention],
        budget: int = MAX_BYTES,
        *,
        reading: View | None = None,
        measure: str = "weight",
        windows: _Windows | None = None,
    ) -> None:
        self._source = rows
        self.reading = View() if reading is None else reading
        self.measure = measure
        if windows is None:
            budget = getattr(rows, "budget", budget)  # a RowSource's: the windows share it with the kept keys
            one = 4 * len(first.layers) * first.num_heads * len(first.keys) * ROW_WINDOW
            windows = _Windows((budget - getattr(rows, "kept_size", 0)) // max(one, 1))
            windows.add(first.measure, tuple(first.queries), first)
        self._windows = windows
        self.raw_tokens = first.tokens
        self._groups = word_groups(first.tokens) if self.reading.words else None
        self._drawn: OrderedDict[tuple[Any, ...], list[Strip]] = OrderedDict()
        self._reads: OrderedDict[int, Attention] = OrderedDict()
        self._lock = threading.Lock()
        self.att = self._skeleton(first)
        self._siblings: dict[tuple[View, str], LongViews] = {(self.reading, self.measure): self}

    def with_options(self, reading: View, measure: str) -> LongViews:
        """The same text and computed windows read with ``reading``, in ``measure``."""
        key = (reading, measure)
        if key not in self._siblings:  # each kept, as the short text's views are: a key back is a lookup
            self._siblings[key] = LongViews(
                self._windows.last(), self._source, reading=reading, measure=measure, windows=self._windows
            )
            self._siblings[key]._siblings = self._siblings
        return self._siblings[key]

    @property
    def kept(self) -> bool:
        """Whether new windows come from kept q and k (no forward pass)."""
        return bool(getattr(self._source, "kept", False))

    def _skeleton(self, first: Attention) -> Attention:
        """The read of one query held whole by ``first`` (any will do: the views need
        its tokens, heads and steps)."""
        if first.measure != self.measure:  # the structure only: the other measure's rows come by fetch
            first = replace(first, measure=self.measure)
        held = set(first.queries)
        groups = self._groups or tuple((q,) for q in first.queries)
        pieces = next((g for g in groups if set(g) <= held), None)
        if pieces is None:  # a word longer than a window: its own rows
            pieces = next(g for g in groups if first.queries[0] in g)
            first = self._source(window_for(pieces, len(self.raw_tokens)), self.measure)
            self._windows.add(self.measure, tuple(first.queries), first)
        # One layer read, its weights shown to every layer (never drawn): the structure
        # costs a 32nd of a read on the bench decoder.
        one = self._apply(replace(first, weights=first.weights[:1], layers=first.layers[:1]), pieces)
        every = np.broadcast_to(one.weights, (len(first.layers), *one.weights.shape[1:]))  # (N, H', 1, S')
        return replace(one, weights=every, layers=first.layers)

    def _apply(self, raw: Attention, pieces: tuple[int, ...]) -> Attention:
        # The CLI's road for one query: its rows only (pipeline.read computes no others; cut
        # here, transforms.select would copy the whole window first), read as pipeline.read
        # reads them, then the shares the views draw.
        slots = [raw.query_slot(p) for p in pieces]
        own = replace(raw, weights=raw.weights[:, :, slots], queries=tuple(pieces))  # (N, H, R, S)
        return shares(apply(own, self.reading, [pieces], raw.layers))

    @property
    def num_tokens(self) -> int:
        return len(self.att.tokens)

    def pieces(self, query: int) -> tuple[int, ...]:
        """The raw token positions of ``query`` (a word: its pieces)."""
        return (query,) if self._groups is None else self._groups[query]

    def rows_for(self, query: int) -> Attention | None:
        """The rows of ``query`` read as the views read them, or None (``fetch`` them)."""
        with self._lock:
            if query in self._reads:
                self._reads.move_to_end(query)
                return self._reads[query]
        raw = self._windows.find(self.measure, self.pieces(query))
        if raw is None:
            return None
        att = self._apply(raw, self.pieces(query))
        with self._lock:
            self._reads[query] = att
            while len(self._reads) > _READS:
                self._reads.popitem(last=False)
        return att

    def layer_rows(self, query: int, layer: int) -> Attention | None:
        """The rows of ``query`` in ``layer`` alone, read as the views read them, or None
        (``fetch`` them). What a view draws: a 32nd of ``rows_for``'s work on the bench
        decoder (the reading steps act on each layer alone, so the rows are the same)."""
        key = (self.reading, self.measure, query, layer)
        att = self._windows.read(key)
        if att is not None:
            return att
        with self._lock:
            whole = self._reads.get(query)
        if whole is not None:
            att = select(whole, layers=[layer])
        else:
            raw = self._windows.find(self.measure, self.pieces(query))
            if raw is None:
                return None
            n = raw.layer_slot(layer)
            att = self._apply(replace(raw, weights=raw.weights[n : n + 1], layers=(layer,)), self.pieces(query))
        self._windows.keep_read(key, att)
        return att

    def can_draw(self, cursor: Cursor) -> bool:
        return self._windows.find(self.measure, self.pieces(cursor.query)) is not None

    def fetch(self, query: int, stay: int | None = None, alone: bool = False) -> tuple[int, ...]:
        """Compute the window holding ``query`` (a forward pass unless q and k are kept;
        any thread); the window of ``stay`` (the cursor's) is not dropped for it.
        ``alone``: the rows of ``query``'s pieces only (an eighth of a window's work)."""
        pieces = self.pieces(query)
        if alone:
            if self._windows.find(self.measure, pieces) is None:
                self._windows.add_alone(self.measure, self._source(pieces, self.measure))
            return pieces
        window = window_for(pieces, len(self.raw_tokens))
        if not self._windows.held(self.measure, pieces):
            keep = self.pieces(stay) if stay is not None else ()
            self._windows.add(self.measure, window, self._source(window, self.measure), keep)
        return window

    def ahead(self, query: int) -> int | None:
        """What to fetch while the user reads: ``query`` when only its own rows are there
        (fetched alone), else a query of the window after (else before) its window that is
        not computed (None: both are there, or there is room for neither beside the cursor's)."""
        n = len(self.raw_tokens)
        window = window_for(self.pieces(query), n)
        beside = [
            window,
            window_of(window[-1] + 1, n) if window[-1] + 1 < n else (),
            window_of(max(window[0] - 1, 0), n),
        ]
        if not self._windows.room(self.measure, beside):
            return None
        if not self._windows.held(self.measure, self.pieces(query)):  # its query alone (fetched ahead of o)
            return query
        for raw in (window[-1] + 1, window[0] - 1):
            if 0 <= raw < n:
                q = raw if self._groups is None else next(w for w, g in enumerate(self._groups) if raw in g)
                if not self._windows.held(self.measure, self.pieces(q)):
                    return q
        return None

    def _key(self, c: Cursor, width: int, color: bool) -> tuple[Any, ...]:
        # The compact rows mark no head; the table reverses the selected head's line.
        values, head = c.values and c.view == "heads", c.head if c.view == "table" else 0
        return (c.view, c.query, c.layer, values, head, width, color)

    def has(self, cursor: Cursor, width: int, color: bool) -> bool:
        with self._lock:
            return self._key(cursor, width, color) in self._drawn

    def render(self, cursor: Cursor, width: int, color: bool) -> list[Strip]:
        """The lines of ``cursor``'s view (its rows must be computed)."""
        key = self._key(cursor, width, color)
        return drawn_once(self._drawn, self._lock, key, lambda: self._draw(cursor, width, color))

    def _draw(self, c: Cursor, width: int, color: bool) -> list[Strip]:
        att = self.layer_rows(c.query, c.layer)
        if att is None:
            raise KeyError(f"the rows of token {c.query} are not computed")
        if c.view == "table":  # metrics of each row alone: this layer's are all it shows
            return strips(head_table(att, head_stats(att, c.query), c, width, color), width)
        if c.view != "heads":
            raise KeyError(f"the {c.view} view needs the full matrices")
        top = values_top_keys(att, width) if c.values else None
        layer = compact_layer(att, c.query, c.layer, width=width, color=color, top_keys=top)
        return compact_strips(layer, legend(color, measure_label(att), compact=True), width)


def compact_strips(layer: CompactLayer, key: Text, width: int) -> list[Strip]:
    """The lines of ``Group(layer.renderable(), key)``, the head lines drawn into segments
    directly (views.line_strip: rich's layout of 33 lines of ~60 spans took ~75 ms at
    8,192 tokens); rich lays out the title, the axis and the key, which may wrap."""
    drawn = [line_strip(line.style, line.runs, width) for line in layer.heads]
    heads = [line for line in drawn if line is not None]
    if len(heads) < len(drawn):  # a line too wide: rich wraps it as show does
        return strips(Group(layer.renderable(), key), width)
    return [*strips(Group(layer.title, layer.axis), width), *heads, *strips(Group(Text(""), key), width)]


def values_top_keys(att: Attention, width: int) -> int:
    """How many strongest keys fill a compact line at ``width`` beside the shortest strip
    (``n``; ``show --top-keys K`` prints the same)."""
    name_w = max(len(att.head_name(h)) for h in range(att.num_heads)) + 1
    one_w = 8 + 1 + len(str(len(att.keys) - 1)) + 4  # "label@pos .wt" (render.terminal.compact)
    return max(1, (width - name_w - 3 - 16) // (one_w + 1))


def matrix_refusal(att: Attention, budget: int = MAX_BYTES) -> str:
    """Why a long text has no matrix view, in one line."""
    n = len(att.keys)
    size = 4 * len(att.layers) * att.model_heads * n * n
    return (
        f"the matrix view draws every query row of a head: a long text keeps the rows of "
        f"{ROW_WINDOW} tokens at a time (the full matrices of {n:,} tokens would take {_bytes(size)}, "
        f"over the explorer's {_bytes(budget)}); for a matrix, attnviz export's matrix view of a shorter text"
    )
