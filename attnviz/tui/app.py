"""The terminal explorer (``attnviz explore``): one loaded model, keys to move through
tokens, layers, heads and views. textual lives in tui/ alone; only the CLI imports it.

The app takes data, never a model: an ``Attention`` with every query row (the whole
L×H×S×S of the kept layers) and a function that runs a new sentence through the model
the CLI has already loaded. Every keypress is answered from memory: the weights are all
there, a query token's per-head metrics are computed once, and each drawn view is kept,
so moving back and forth costs a dictionary lookup and a repaint (bench/explore_latency.py).
The two slow things, a new forward pass (``/``) and an image export (``e``), run in a
worker thread and say so on the message line while the keys keep working.

DrawnViews (``v`` cycles, ``1``-``3`` pick):

- ``heads``: the token heatmap of ``attnviz show``: heads × tokens for the query token
  in one layer (render.terminal.token_heatmap), the selected head marked;
- ``table``: one line per head of the layer with where the token attends (top 3,
  entropy, sink, self, prev, next, distance: metrics.head_stats, render.tables);
- ``matrix``: the full query × key matrix of the selected head (render.terminal.matrix_heatmap).

A long text (its full matrices over the budget) comes with ``rows`` and is drawn from rows
(tui.long): the compact rows of ``show`` and the head table, every reading option and the
norms; the matrix says in a line that it needs every query row. While the user reads (a
0.25 s pause), the windows beside the cursor's are fetched in the worker and the views one
key away drawn, the reading keys' (w s m o) among them: their first press is then a lookup.

With NO_COLOR set, textual draws in monochrome and the cells fall back to the shade
glyphs of the plain-terminal heatmap, so nothing is carried by colour alone.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.strip import Strip
from textual.widgets import Input, Static

from ..errors import AttnvizError
from ..render.terminal import provenance_line
from ..result import Attention
from ..tokens import Tokens
from ..transforms import View, apply, shares
from .keys import BINDINGS, KeysScreen, footer
from .long import LONG_TITLES, LONG_VIEWS, LongViews, matrix_refusal
from .views import (
    VIEW_TITLES,
    VIEWS,
    Cursor,
    DrawnViews,
    export_name,
    first_query,
    free_path,
    landed,
    landing,
    toggled,
    token_line,
    write_view_png,
)
from .widgets import Lines, SentenceInput, in_order

# Idle time (s) before a view is drawn ahead: longer than a held key's repeat (~30 ms), shorter
# than reading a screen. One view is ~11 ms of CPU (MiniLM example, measured on 2 busy cores).
_WARM_DELAY = 0.1
# A long text does more ahead: a dozen views (~10 ms of CPU each at 8,192 tokens) and windows
# of rows in the worker (0.3-2 s of CPU each), so it waits for a longer pause: a key tapped
# within it shares the cores with no work it did not ask for.
_LONG_WARM_DELAY = 0.25
# CPU s: a view that took longer to draw is not drawn ahead again for this sentence (the
# example's views take ~11 ms; a 56-token sentence's matrix ~160 ms).
_WARM_MAX = 0.05


class ExploreApp(App[None]):
    """Explore one sentence's attention with the keyboard; ``/`` runs another.

    Args:
        att: the sentence's weights with every query row (``inspect(..., queries=None)``).
        run: runs a new sentence through the already-loaded model and returns the same
            kind of ``Attention``; None disables ``/``. Called in a worker thread.
        query: the token to start on (default: the first one the tokenizer did not add).
        export_dir: where ``e`` writes PNG files (default: the current directory).
        dpi: the PNG's resolution.
        rows: a long text: ``att`` holds the rows of some query tokens only and ``rows``
            computes those of others (raw positions; ``rows(queries, measure)``, a
            ``long.RowSource``); the views then work on rows (``long.LongViews``).
    """

    TITLE = "attnviz explore"
    ENABLE_COMMAND_PALETTE = False
    AUTO_FOCUS = None  # keys go to the app's bindings; the sentence box takes them only when open
    CSS = """
    Screen { layout: vertical; }
    #header { height: auto; color: $text-muted; }
    #status { height: 1; text-style: bold; }
    #tokens { height: auto; max-height: 4; margin-bottom: 1; }
    #view { height: 1fr; }
    #message { height: auto; max-height: 3; }
    #ask { display: none; }
    #ask.open { display: block; }
    #footer { height: auto; max-height: 2; background: $panel; }
    """
    BINDINGS: ClassVar[list[BindingType]] = BINDINGS

    def __init__(
        self,
        att: Attention,
        run: Callable[[str], Attention] | None = None,
        *,
        query: int | None = None,
        export_dir: Path | None = None,
        dpi: int = 150,
        run_norms: Callable[[str | Tokens], Attention] | None = None,
        rows: Callable[..., Attention] | None = None,
    ) -> None:
        super().__init__()
        self._run = run
        # The norm measure (key o): computed for the sentence on first use, then kept.
        self._run_norms = run_norms
        self.measure = "weight"
        self._raws: dict[str, Attention] = {}
        self._export_dir = Path(".") if export_dir is None else Path(export_dir)
        self._dpi = dpi
        self._busy: set[str] = set()  # "run", "export": one of each at a time
        # A long text: rows of a few tokens at a time, drawn as compact rows.
        self.long = None if rows is None else LongViews(att, rows)
        self.raw = att if self.long is not None else DrawnViews(att).att  # checked: every query row
        self._raws = {"weight": self.raw}
        self.reading = View()
        self._views: dict[View, DrawnViews] = {}
        self.views: DrawnViews | LongViews = self.long if self.long is not None else self._views_for(self.reading)
        start = first_query(att) if query is None else query
        if not 0 <= start < len(att.tokens):
            raise ValueError(f"query {start} is out of range (0..{len(att.tokens) - 1})")
        self.cursor = Cursor(view="heads", layer=att.layers[0], head=0, query=start)
        self.message = ""
        self._one_line = True  # the message takes one line: another one-line message needs no layout
        self._warm_queue: list[tuple[str, Cursor]] = []  # (a reading key's option, or "": the views on screen)
        self._warm_round = 0  # bumped on every view shown: older draw-ahead ticks stand down
        self._slow_views: set[str] = set()
        self._waiting = False  # a long text: the screen says the cursor's rows are being computed

    # --- data ---------------------------------------------------------------------

    @property
    def att(self) -> Attention:
        return self.views.att

    @property
    def color(self) -> bool:
        # textual turns the screen monochrome under NO_COLOR; the cells then need glyphs.
        return not self.no_color

    def _views_for(self, reading: View) -> DrawnViews:
        """The views of the raw weights read with ``reading`` (transforms.apply, once each)."""
        if reading not in self._views:
            self._views[reading] = DrawnViews(shares(apply(self.raw, reading)))  # shares: the norm measure's rows
        return self._views[reading]

    def _reading_names(self) -> list[tuple[bool, str]]:
        r = self.reading
        return [
            (r.words, "words"),
            (r.hide_special, "specials set aside"),
            (bool(r.heads), "head mean"),
            (self.measure == "norm", "norm shares ‖α·f(x)‖"),
        ]

    # --- layout -------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        yield Static(id="status")
        yield Static(id="tokens")
        yield Lines(id="view")
        yield Static(id="message")
        yield SentenceInput(placeholder="a new sentence, Enter to run it, Esc to cancel", id="ask", disabled=True)
        yield Static(id="footer")

    def on_mount(self) -> None:
        # What is alive now (torch, the model, textual) outlives the session: frozen out of
        # the collector's reach, a full collection scans only what the session makes.
        # Measured: ~100 ms pauses, one every few new sentences, became 4-8 ms.
        gc.freeze()
        self._show_header()
        self.query_one("#footer", Static).update(Text(footer(self.size.width)))
        self.refresh_view()

    def on_unmount(self) -> None:
        gc.unfreeze()  # back to normal for a Python caller of explore()

    def on_resize(self) -> None:
        self.query_one("#footer", Static).update(Text(footer(self.size.width)))
        self.refresh_view()

    def _show_header(self) -> None:
        p = self.att.provenance
        text = provenance_line(p)
        notes = p.shape.notes()
        self.query_one("#header", Static).update(Text("\n".join([text, *notes])))

    def _view_width(self) -> int:
        # The screen's width less a vertical scroll bar's: known before the first layout,
        # and one layout for every view (no redraw when a scroll bar comes and goes).
        return max(self.size.width - 2, 40)

    def refresh_view(self) -> None:
        """Show the cursor's view, status line, token line and message."""
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
        reading = [name for on, name in self._reading_names() if on]
        if reading:
            status.append("  " + " · ".join(reading), style="italic")
        # layout=False: these lines keep their height, so a key costs no re-layout.
        self.query_one("#status", Static).update(status, layout=False)
        reach = max(4, self._view_width() // 12) if self.long is not None else None  # a long text: 4 lines at most
        self.query_one("#tokens", Static).update(token_line(att.tokens, c.query, reach), layout=False)
        # A view drawn already needs no rows (they may have made room for the other measure's).
        long, width = self.long, self._view_width()
        self._waiting = long is not None and not (long.has(c, width, self.color) or long.can_draw(c))
        if self.long is not None and self._waiting:
            self._fetch_rows(c.query)
            n = len(self.long.raw_tokens)
            how = "from the kept keys" if self.long.kept else f"a forward pass over {n:,} tokens"
            wait = Text(f"computing the rows of token {c.query} ({how})…")
            self.query_one("#view", Lines).show([Strip([Segment(wait.plain)])])
            self._warm_queue = []
            return
        self.query_one("#view", Lines).show(self.views.render(c, width, self.color))
        # Draw ahead once the keys pause: a held key gets no drawing it did not ask for.
        self._warm_ahead()

    def _warm_ahead(self) -> None:
        """Once the keys pause: on a long text the windows beside the cursor's are fetched
        (in the worker), then the views one key away are drawn, one per tick."""
        self._warm_queue = self._neighbours(self.cursor)
        self._warm_round += 1
        delay = _WARM_DELAY if self.long is None else _LONG_WARM_DELAY
        self.set_timer(delay, partial(self._warm_one, self._warm_round, first=True))

    def _neighbours(self, c: Cursor) -> list[tuple[str, Cursor]]:
        """The views one key away from ``c``, most likely first: "" and a cursor on the
        views on screen, or a reading key's option and ``c`` (``_warm_one`` finds the
        views of that reading and the cursor's place in them when it draws)."""
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

    @property
    def drawing_ahead(self) -> bool:
        """Whether views one key away are still to be drawn (benchmarks wait for this)."""
        return bool(self._warm_queue)

    def _warm_one(self, round_: int, first: bool = False) -> None:
        """Draw one view a key away while the user reads this one: a keypress then finds
        its view drawn. One per timer tick, so a key pressed meanwhile waits for one
        drawing at most."""
        if round_ != self._warm_round:
            return  # a key came since: its own round draws its neighbours
        if first:
            self._fetch_ahead()  # (a long text's windows, in the worker)
        width, color = self._view_width(), self.color
        while self._warm_queue:
            option, cursor = self._warm_queue.pop(0)
            views: DrawnViews | LongViews = self.views
            if option and self.long is not None:
                views = self.long.with_options(*toggled(self.reading, self.measure, option))
                cursor = landed(cursor, self.att, views.att)
            if cursor.view in self._slow_views or views.has(cursor, width, color):
                continue
            if isinstance(views, LongViews) and not views.can_draw(cursor):
                if option == "measure" and views.kept:
                    # o's rows: the cursor's alone, from the kept keys in the worker (~0.5 s
                    # at 8,192 tokens), drawn when they are in; never a forward pass ahead.
                    self._fetch_rows(cursor.query, views, alone=True)
                continue  # else computed when the cursor gets there
            start = time.thread_time()  # CPU time: what the drawing costs, whatever the load
            views.render(cursor, width, color)
            if time.thread_time() - start > _WARM_MAX and self.long is None:
                # (a long text's views are always drawn ahead: ~10 ms each at 8,192 tokens)
                # A key pressed during a drawing waits for it: views this slow to draw (a
                # long sentence's matrix) are drawn when asked for, not ahead.
                self._slow_views.add(cursor.view)
            break
        if self._warm_queue:
            self.set_timer(0.01, partial(self._warm_one, round_))
        else:
            self._settle()

    def _settle(self) -> None:
        # The views drawn ahead are kept (a long text's, ~2,000 segments each, a dozen a key):
        # frozen out of the collector's reach as at mount, once the young generations are
        # collected. Full collections scanning them took 20-40 ms in a key, and grew.
        gc.collect(1)
        gc.freeze()

    # --- long texts -----------------------------------------------------------------

    def _fetch_rows(self, query: int, views: LongViews | None = None, alone: bool = False) -> None:
        """Compute the rows of ``query``'s window (``alone``: its own only) for ``views``
        (default: the screen's) in a worker thread, then show them."""
        if "rows" in self._busy:
            return  # the cursor is looked at again when the running one is done
        long = self.long if views is None else views
        assert long is not None
        self._busy.add("rows")
        stay = self.cursor.query

        def work() -> None:
            try:
                long.fetch(query, stay, alone)
            except AttnvizError as exc:
                self.call_from_thread(self._rows_done, _error_line(exc))
            except Exception as exc:  # a bug must not kill the session
                self.call_from_thread(self._rows_done, f"error: {type(exc).__name__}: {exc}")
            else:
                self.call_from_thread(self._rows_done, "")

        self.run_worker(work, thread=True, group="rows")

    def _rows_done(self, line: str) -> None:
        self._busy.discard("rows")
        if line:
            self.say(line)
        if self.long is None:
            return  # a sentence typed at / came meanwhile
        if self._waiting:  # (on any views: the options may have changed during the fetch)
            if not line or self.long.can_draw(self.cursor):
                self.refresh_view()  # the cursor's rows, or the fetch of its window
        elif not line:  # rows fetched ahead: the views one key away in them can be drawn now
            self._warm_ahead()
            self._fetch_ahead()

    def _fetch_ahead(self) -> None:
        """While the user reads, the windows before and after the cursor's."""
        if self.long is not None and "rows" not in self._busy:
            ahead = self.long.ahead(self.cursor.query)
            if ahead is not None:
                self._fetch_rows(ahead)

    def say(self, message: str) -> None:
        box = self.query_one("#message", Static)
        # One line where one line was (an empty message takes one too): no re-layout, ~20 ms
        # on a long text's screen. A message that wraps may take more lines: laid out again.
        fits = "\n" not in message and cell_len(message) <= box.size.width
        box.update(Text(message), layout=not (fits and self._one_line))
        self.message, self._one_line = message, fits

    # --- moving -------------------------------------------------------------------

    def _move(self, **changes: Any) -> None:
        self.cursor = replace(self.cursor, **changes)
        self.refresh_view()

    def action_move_query(self, step: int) -> None:
        self._move(query=(self.cursor.query + step) % len(self.att.tokens))

    def action_move_layer(self, step: int) -> None:
        layers = self.att.layers
        self._move(layer=layers[(layers.index(self.cursor.layer) + step) % len(layers)])

    def action_move_head(self, step: int) -> None:
        self._move(head=(self.cursor.head + step) % self.att.num_heads)

    def action_next_view(self) -> None:
        views = VIEWS if self.long is None else LONG_VIEWS  # a long text: the views that work on rows
        at = views.index(self.cursor.view) if self.cursor.view in views else -1
        self._move(view=views[(at + 1) % len(views)])

    def action_view(self, view: str) -> None:
        if self.long is not None and view not in LONG_VIEWS:
            self.say(matrix_refusal(self.att))
            return
        self._move(view=view)

    def action_toggle_values(self) -> None:
        self._move(values=not self.cursor.values)

    def action_toggle_reading(self, option: str) -> None:
        """Words merged, specials set aside or the head mean, on or off: the cursor stays
        on the same token (its word) and head."""
        reading, _ = toggled(self.reading, self.measure, option)
        views: DrawnViews | LongViews
        if self.long is not None:
            views = self.long = self.long.with_options(reading, self.measure)
        else:
            views = self._views_for(reading)
        cursor = landed(self.cursor, self.att, views.att)
        self.reading, self.views = reading, views
        self._slow_views = set()
        self._move(query=cursor.query, head=cursor.head)

    def action_toggle_measure(self) -> None:
        """The weights or the norms (their shares), on the same sentence, token and head."""
        _, measure = toggled(self.reading, self.measure, "measure")
        if self.long is not None:  # rows in the other measure: from the kept keys, or a pass per window
            self.measure = measure
            self.views = self.long = self.long.with_options(self.reading, measure)
        elif measure not in self._raws:
            if self._run_norms is None:
                self.say("this explorer has no model to compute the norms with")
                return
            try:
                self._raws[measure] = DrawnViews(self._run_norms(self.raw.tokens)).att
            except AttnvizError as exc:
                self.say(_error_line(exc))
                return
        if self.long is None:
            self.measure, self.raw = measure, self._raws[measure]
            self._views = {}
            self.views = self._views_for(self.reading)
        self._slow_views = set()
        self._move(query=self.cursor.query, head=self.cursor.head)
        self.say(f"measure: {'norm shares ‖α·f(x)‖ (Kobayashi et al. 2020)' if measure == 'norm' else 'weight'}")

    def action_scroll(self, where: str) -> None:
        body = self.query_one("#view", Lines)
        {"page_up": body.scroll_page_up, "page_down": body.scroll_page_down}.get(
            where, body.scroll_home if where == "home" else body.scroll_end
        )(animate=False)

    def action_keys(self) -> None:
        self.push_screen(KeysScreen())

    # --- a new sentence -------------------------------------------------------------

    def action_ask(self) -> None:
        if self._run is None:
            self.say("this explorer has no model to run a new sentence through")
            return
        ask = self.query_one("#ask", Input)
        ask.disabled = False
        ask.add_class("open")
        ask.value = ""
        # Keys reach the prompt by its "open" class (widgets.in_order), not by focus; focus
        # now, not at the end of the message queue as Widget.focus(), shows its cursor at once.
        self.screen.set_focus(ask)

    def action_close_ask(self) -> None:
        ask = self.query_one("#ask", Input)
        if ask.has_class("open"):
            ask.remove_class("open")
            ask.blur()
            ask.disabled = True

    async def on_event(self, event: events.Event) -> None:
        if not await in_order(self, event, self.submit):  # keys skip textual's queues: see in_order
            await super().on_event(event)

    def submit(self, sentence: str) -> None:
        """Run the sentence typed at the / prompt (in a worker), and close the prompt."""
        self.action_close_ask()
        if not sentence.strip():
            self.say("the sentence is empty: press / and type one")
            return
        if "run" in self._busy:
            self.say("still running the previous sentence…")
            return
        self._busy.add("run")
        self.say(f"running the model on {sentence!r}…")
        self.run_worker(lambda: self._run_sentence(sentence), thread=True, group="run")

    def _run_sentence(self, sentence: str) -> None:
        try:
            assert self._run is not None  # action_ask checked it
            run = self._run_norms if self.measure == "norm" and self._run_norms is not None else self._run
            views = DrawnViews(run(sentence))
            # Read as the user reads now and draw the view the cursor will land on, off the event loop.
            fresh = self.reading != View() or views.att.measure == "norm"
            read = DrawnViews(shares(apply(views.att, self.reading))) if fresh else views
            read.render(landing(self.cursor, self.att, read.att), self._view_width(), self.color)
        except AttnvizError as exc:
            self.call_from_thread(self._done, "run", _error_line(exc))
        except Exception as exc:  # a bug must not kill the session: say it and keep the old sentence
            self.call_from_thread(self._done, "run", f"error: {type(exc).__name__}: {exc}")
        else:
            self.call_from_thread(self._loaded, views, read)

    def _loaded(self, raw: DrawnViews, read: DrawnViews) -> None:
        self._busy.discard("run")
        self.raw = raw.att
        self._raws = {raw.att.measure: raw.att}  # the other measure: computed again when asked
        self._views = {self.reading: read} if raw.att.measure == "norm" else {View(): raw, self.reading: read}
        views = self._views_for(self.reading)
        self.cursor = landing(self.cursor, self.att, views.att)
        self.long = None  # a sentence typed at / is short: today's views
        self.views = views
        self._slow_views = set()
        self._show_header()
        self.refresh_view()
        self.query_one("#tokens", Static).refresh(layout=True)  # a new sentence may wrap differently
        self.say(f"new sentence: {len(views.att.tokens)} tokens")

    def _done(self, job: str, line: str) -> None:
        self._busy.discard(job)
        self.say(line)

    # --- export ---------------------------------------------------------------------

    def action_export(self) -> None:
        if "export" in self._busy:
            self.say("still exporting the previous view…")
            return
        self._busy.add("export")
        cursor, att = self.cursor, self.att
        if self.long is not None:
            rows = self.long.rows_for(cursor.query)
            if rows is None:
                self.say("the rows of this token are still being computed")
                return
            att = rows
        path = free_path(self._export_dir, export_name(cursor, att))
        self.say(f"exporting to {path}…")
        self.run_worker(lambda: self._export(att, cursor, path), thread=True, group="export")

    def _export(self, att: Attention, cursor: Cursor, path: Path) -> None:
        try:
            write_view_png(att, cursor, path, self._dpi)
        except AttnvizError as exc:
            self.call_from_thread(self._done, "export", _error_line(exc))
        except Exception as exc:
            self.call_from_thread(self._done, "export", f"error: {type(exc).__name__}: {exc}")
        else:
            note = " (the head table's layer, as a token heatmap)" if cursor.view == "table" else ""
            self.call_from_thread(self._done, "export", f"wrote {path}{note}")


def _error_line(exc: AttnvizError) -> str:
    return f"error: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")


def explore(att: Attention, run: Callable[[str], Attention] | None = None, **options: Any) -> None:
    """Run the explorer in the terminal until the user quits."""
    ExploreApp(att, run, **options).run()
