"""The explorer's state apart from the screen: the sentence's weights in each measure, the
reading options, the drawn views kept for each reading, the cursor, and what each key does
to them (``Session``). No widgets, timers or threads here: tui/app.py shows a ``Session``,
maps keys to its methods and runs the slow ones (a new sentence) in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rich.text import Text

from ..errors import AttnvizError
from ..measures.base import measure_named
from ..result import Attention
from ..tokens import Tokens
from ..transforms import View, apply, shares
from .long import LONG_TITLES, LONG_VIEWS, LongViews, matrix_refusal
from .views import VIEW_TITLES, VIEWS, Cursor, DrawnViews, first_query, landed, landing, toggled


def error_line(exc: AttnvizError) -> str:
    """The message line for a library error: its message and hint."""
    return f"error: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")


class Session:
    """One sentence in the explorer and where the user is in it.

    Args:
        att: the sentence's weights with every query row (``inspect(..., queries=None)``),
            or, with ``rows``, those of some query tokens only.
        run: runs a new sentence through the already-loaded model; None: no ``/``.
        run_norms: the same in the norm measure; None: no ``o`` on a short text.
        query: the token to start on (default: the first one the tokenizer did not add).
        rows: a long text: computes the rows of other query tokens (``attnviz.cli.exploring.RowSource``);
            the views then work on rows (``long.LongViews``).

    Raises:
        ValueError: ``query`` is not a position of ``att``.
    """

    def __init__(
        self,
        att: Attention,
        *,
        run: Callable[[str], Attention] | None = None,
        run_norms: Callable[[str | Tokens], Attention] | None = None,
        query: int | None = None,
        rows: Callable[..., Attention] | None = None,
    ) -> None:
        self.run = run
        # The norm measure (key o): computed for the sentence on first use, then kept.
        self.run_norms = run_norms
        self.measure = "weight"
        # A long text: rows of a few tokens at a time, drawn as compact rows.
        self.long = None if rows is None else LongViews(att, rows)
        self.raw = att if self.long is not None else DrawnViews(att).att  # checked: every query row
        self.raws: dict[str, Attention] = {"weight": self.raw}
        self.reading = View()
        self._views: dict[View, DrawnViews] = {}
        self.views: DrawnViews | LongViews = self.long if self.long is not None else self.views_for(self.reading)
        start = first_query(att) if query is None else query
        if not 0 <= start < len(att.tokens):
            raise ValueError(f"query {start} is out of range (0..{len(att.tokens) - 1})")
        self.cursor = Cursor(view="heads", layer=att.layers[0], head=0, query=start)
        # Kinds of view too slow to draw ahead in these views (tui.app); reset with the views.
        self.slow_views: set[str] = set()

    # --- what is shown ----------------------------------------------------------------

    @property
    def att(self) -> Attention:
        """The weights the views draw (the raw ones read with the reading options)."""
        return self.views.att

    def views_for(self, reading: View) -> DrawnViews:
        """The views of the raw weights read with ``reading`` (transforms.apply, once each)."""
        if reading not in self._views:
            self._views[reading] = DrawnViews(shares(apply(self.raw, reading)))  # shares: the norm measure's rows
        return self._views[reading]

    def reading_names(self) -> list[tuple[bool, str]]:
        r = self.reading
        return [
            (r.words, "words"),
            (r.hide_special, "specials set aside"),
            (bool(r.heads), "head mean"),
            (not measure_named(self.measure).sums_to_one, "norm shares ‖α·f(x)‖"),
        ]

    def status(self) -> Text:
        """The status line: layer, head, token, view and the reading options on."""
        c = self.cursor
        att = self.att
        layers = att.layers
        status = Text()
        status.append(f"layer {c.layer}", style="bold")
        status.append(f" ({layers.index(c.layer) + 1}/{len(layers)})  ")
        status.append(att.head_name(c.head), style="bold")
        status.append(f" ({c.head + 1}/{att.num_heads})  ")
        status.append(f"token {c.query} {att.tokens.labels[c.query]!r}", style="bold")
        title = VIEW_TITLES[c.view] if self.long is None else LONG_TITLES[c.view]
        status.append(f"  view: {title} [{VIEWS.index(c.view) + 1}]")
        if c.values:
            status.append("  values")
        reading = [name for on, name in self.reading_names() if on]
        if reading:
            status.append("  " + " · ".join(reading), style="italic")
        return status

    # --- moving -----------------------------------------------------------------------

    def step_query(self, step: int) -> None:
        self.cursor = replace(self.cursor, query=(self.cursor.query + step) % len(self.att.tokens))

    def step_layer(self, step: int) -> None:
        layers = self.att.layers
        self.cursor = replace(self.cursor, layer=layers[(layers.index(self.cursor.layer) + step) % len(layers)])

    def step_head(self, step: int) -> None:
        self.cursor = replace(self.cursor, head=(self.cursor.head + step) % self.att.num_heads)

    def next_view(self) -> None:
        views = VIEWS if self.long is None else LONG_VIEWS  # a long text: the views that work on rows
        at = views.index(self.cursor.view) if self.cursor.view in views else -1
        self.cursor = replace(self.cursor, view=views[(at + 1) % len(views)])

    def show_view(self, view: str) -> str | None:
        """Show ``view``; or, where it cannot be drawn, the line that says why."""
        if self.long is not None and view not in LONG_VIEWS:
            return matrix_refusal(self.att)
        self.cursor = replace(self.cursor, view=view)
        return None

    def toggle_values(self) -> None:
        self.cursor = replace(self.cursor, values=not self.cursor.values)

    # --- reading options --------------------------------------------------------------

    def toggle_reading(self, option: str) -> None:
        """Words merged, specials set aside or the head mean, on or off: the cursor stays
        on the same token (its word) and head."""
        reading, _ = toggled(self.reading, self.measure, option)
        views: DrawnViews | LongViews
        if self.long is not None:
            views = self.long = self.long.with_options(reading, self.measure)
        else:
            views = self.views_for(reading)
        cursor = landed(self.cursor, self.att, views.att)
        self.reading, self.views = reading, views
        self.slow_views = set()
        self.cursor = replace(self.cursor, query=cursor.query, head=cursor.head)

    def toggle_measure(self) -> str | None:
        """The weights or the norms (their shares), on the same sentence, token and head;
        or, where the norms cannot be had, the line that says why. A short text's norms
        are a forward pass (``run_norms``), on first use."""
        _, measure = toggled(self.reading, self.measure, "measure")
        if self.long is not None:  # rows in the other measure: from the kept keys, or a pass per window
            self.measure = measure
            self.views = self.long = self.long.with_options(self.reading, measure)
        elif measure not in self.raws:
            if self.run_norms is None:
                return "this explorer has no model to compute the norms with"
            try:
                self.raws[measure] = DrawnViews(self.run_norms(self.raw.tokens)).att
            except AttnvizError as exc:
                return error_line(exc)
        if self.long is None:
            self.measure, self.raw = measure, self.raws[measure]
            self._views = {}
            self.views = self.views_for(self.reading)
        self.slow_views = set()
        return None

    # --- a new sentence ---------------------------------------------------------------

    def read_sentence(self, sentence: str, width: int, color: bool) -> tuple[DrawnViews, DrawnViews]:
        """Run ``sentence`` through the model (``run``, or ``run_norms`` in the norm measure)
        and read it as the user reads now; draws the view the cursor will land on. Slow (a
        forward pass): tui.app calls it in a worker thread, then ``load`` with the result.

        Returns:
            the raw weights' views and the views read with the reading options (the same
            object when no option is on).
        """
        if self.run is None:
            raise ValueError("this session has no model to run a new sentence through")
        run = self.run_norms if measure_named(self.measure).needs_values and self.run_norms is not None else self.run
        views = DrawnViews(run(sentence))
        fresh = self.reading != View() or not measure_named(views.att.measure).sums_to_one
        read = DrawnViews(shares(apply(views.att, self.reading))) if fresh else views
        read.render(landing(self.cursor, self.att, read.att), width, color)
        return views, read

    def load(self, raw: DrawnViews, read: DrawnViews) -> None:
        """Show a new sentence (``read_sentence``'s result) from where the cursor is."""
        self.raw = raw.att
        self.raws = {raw.att.measure: raw.att}  # the other measure: computed again when asked
        shares_only = not measure_named(raw.att.measure).sums_to_one
        self._views = {self.reading: read} if shares_only else {View(): raw, self.reading: read}
        views = self.views_for(self.reading)
        self.cursor = landing(self.cursor, self.att, views.att)
        self.long = None  # a sentence typed at / is short: today's views
        self.views = views
        self.slow_views = set()

    # --- one key away -----------------------------------------------------------------

    def neighbours(self, c: Cursor) -> list[tuple[str, Cursor]]:
        """The views one key away from ``c``, most likely first: "" and a cursor on the
        views on screen, or a reading key's option and ``c`` (``one_key_away`` finds the
        views of that reading and the cursor's place in them)."""
        n_tok, n_heads, layers = len(self.att.tokens), self.att.num_heads, self.att.layers
        at = layers.index(c.layer)
        moves = [
            replace(c, query=(c.query + 1) % n_tok),
            replace(c, query=(c.query - 1) % n_tok),
            replace(c, layer=layers[(at + 1) % len(layers)]),
            replace(c, layer=layers[(at - 1) % len(layers)]),
            replace(c, head=(c.head + 1) % n_heads),
            replace(c, head=(c.head - 1) % n_heads),
            *(replace(c, view=view) for view in (VIEWS if self.long is None else LONG_VIEWS) if view != c.view),
            replace(c, values=not c.values),
        ]
        near = [("", m) for m in moves]
        if self.long is not None:
            # A long text's reading keys too (w s m o): ~10 ms of CPU each at 8,192 tokens
            # (the cursor's layer read, its compact lines); short texts' readings transform
            # every query row, and are computed when asked for.
            near += [(option, c) for option in ("words", "hide_special", "heads", "measure")]
        return near

    def one_key_away(self, option: str, cursor: Cursor) -> tuple[DrawnViews | LongViews, Cursor]:
        """The views and cursor of a ``neighbours`` entry: on a long text, a reading key's
        option gives the views read with it and the cursor's place in them."""
        if option and self.long is not None:
            views = self.long.with_options(*toggled(self.reading, self.measure, option))
            return views, landed(cursor, self.att, views.att)
        return self.views, cursor
