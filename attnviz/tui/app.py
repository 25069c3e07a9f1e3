"""The terminal explorer (``attnviz explore``): one loaded model, keys to move through
tokens, layers, heads and views. textual lives in tui/ alone; only the CLI imports it.

This module is the textual app: the screen's layout, each key's action on the session
(tui.state), and the work kept off the key path (views drawn ahead on timers; rows, new
sentences and exports in worker threads). The keys are listed in tui.keys, the widgets
are in tui.widgets, the drawn views in tui.views and tui.long.

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
  entropy, sink, self, prev, next, distance: metrics.head_stats, render.terminal.tables);
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
from ..render import written_legend
from ..render.terminal import provenance_line
from ..result import Attention
from ..tokens import Tokens
from ..transforms import View
from .analysis import Ablate, Explain, HeadEffects, ablation_view, explain_screen
from .keys import BINDINGS, KeysScreen, footer
from .long import LongViews
from .state import Session, error_line
from .views import Cursor, DrawnViews, export_name, free_path, raw_position, strips, token_line, write_view_png
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
        run_norms: ``run`` in the norm measure (key ``o``); None: no ``o`` on a short text.
        rows: a long text: ``att`` holds the rows of some query tokens only and ``rows``
            computes those of others (raw positions; ``rows(queries, measure)``, a
            ``attnviz.cli.exploring.RowSource``); the views then work on rows (``long.LongViews``).
        ablate: the head effects at a token (``tui.analysis.Ablate``, key ``a``); None: no ``a``.
        explain: one head's steps for a token (``tui.analysis.Explain``, key ``x``); None: no ``x``.
            Both are called in a worker thread, their answers kept for the sentence.
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
        ablate: Ablate | None = None,
        explain: Explain | None = None,
    ) -> None:
        super().__init__()
        self.session = Session(att, run=run, run_norms=run_norms, query=query, rows=rows)
        self._ablate, self._explain = ablate, explain
        # Answers of a and x, kept per (tokens, raw query[, layer, head]): a second press is a lookup.
        self._answers: dict[tuple[Any, ...], Any] = {}
        self.panel: str | None = None  # "ablate" or "explain" while its answer is on screen
        self._export_dir = Path(".") if export_dir is None else Path(export_dir)
        self._dpi = dpi
        self._busy: set[str] = set()  # "run", "export", "rows": one of each at a time
        self.message = ""
        self._one_line = True  # the message takes one line: another one-line message needs no layout
        self._warm_queue: list[tuple[str, Cursor]] = []  # (a reading key's option, or "": the views on screen)
        self._warm_round = 0  # bumped on every view shown: older draw-ahead ticks stand down
        self._waiting = False  # a long text: the screen says the cursor's rows are being computed

    # --- the session, read (tests and bench/explore_latency.py read these) ------------

    @property
    def att(self) -> Attention:
        return self.session.att

    @property
    def cursor(self) -> Cursor:
        return self.session.cursor

    @property
    def views(self) -> DrawnViews | LongViews:
        return self.session.views

    @property
    def long(self) -> LongViews | None:
        return self.session.long

    @property
    def raw(self) -> Attention:
        return self.session.raw

    @property
    def reading(self) -> View:
        return self.session.reading

    @property
    def measure(self) -> str:
        return self.session.measure

    @property
    def color(self) -> bool:
        # textual turns the screen monochrome under NO_COLOR; the cells then need glyphs.
        return not self.no_color

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
        # Measured (bench/explore_gc.py, --rounds 6: 52 s of keys and new sentences):
        # without this freeze and _settle's, 8-9 full collections at ~104 ms of CPU each,
        # each stalling the app (it holds the GIL); with them, none. The price: cycles that
        # die later (textual's strip caches, ~4 MiB after 20 sentences, no weights) stay
        # until unmount.
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
        written = written_legend(self.att.tokens)  # --generate: which tokens the model wrote
        notes = [*notes, written] if written is not None else notes
        self.query_one("#header", Static).update(Text("\n".join([text, *notes])))

    def _view_width(self) -> int:
        # The screen's width less a vertical scroll bar's: known before the first layout,
        # and one layout for every view (no redraw when a scroll bar comes and goes).
        return max(self.size.width - 2, 40)

    def refresh_view(self) -> None:
        """Show the cursor's view, status line, token line and message."""
        self.panel = None  # any key that redraws the view closes an analysis' screen
        s = self.session
        c = s.cursor
        # layout=False: these lines keep their height, so a key costs no re-layout.
        self.query_one("#status", Static).update(s.status(), layout=False)
        reach = max(4, self._view_width() // 12) if s.long is not None else None  # a long text: 4 lines at most
        self.query_one("#tokens", Static).update(token_line(s.att.tokens, c.query, reach), layout=False)
        # A view drawn already needs no rows (they may have made room for the other measure's).
        long, width = s.long, self._view_width()
        self._waiting = long is not None and not (long.has(c, width, self.color) or long.can_draw(c))
        if long is not None and self._waiting:
            self._fetch_rows(c.query)
            n = len(long.raw_tokens)
            how = "from the kept keys" if long.kept else f"a forward pass over {n:,} tokens"
            wait = Text(f"computing the rows of token {c.query} ({how})…")
            self.query_one("#view", Lines).show([Strip([Segment(wait.plain)])])
            self._warm_queue = []
            return
        self.query_one("#view", Lines).show(s.views.render(c, width, self.color))
        # Draw ahead once the keys pause: a held key gets no drawing it did not ask for.
        self._warm_ahead()

    def say(self, message: str) -> None:
        box = self.query_one("#message", Static)
        # One line where one line was (an empty message takes one too): no re-layout, ~20 ms
        # on a long text's screen. A message that wraps may take more lines: laid out again.
        fits = "\n" not in message and cell_len(message) <= box.size.width
        box.update(Text(message), layout=not (fits and self._one_line))
        self.message, self._one_line = message, fits

    # --- drawing ahead ------------------------------------------------------------

    def _warm_ahead(self) -> None:
        """Once the keys pause: on a long text the windows beside the cursor's are fetched
        (in the worker), then the views one key away are drawn, one per tick."""
        self._warm_queue = self.session.neighbours(self.cursor)
        self._warm_round += 1
        delay = _WARM_DELAY if self.long is None else _LONG_WARM_DELAY
        self.set_timer(delay, partial(self._warm_one, self._warm_round, first=True))

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
        s = self.session
        while self._warm_queue:
            option, cursor = self._warm_queue.pop(0)
            views, cursor = s.one_key_away(option, cursor)
            if cursor.view in s.slow_views or views.has(cursor, width, color):
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
                s.slow_views.add(cursor.view)
            break
        if self._warm_queue:
            self.set_timer(0.01, partial(self._warm_one, round_))
        else:
            self._settle()

    def _settle(self) -> None:
        # The views drawn ahead are kept (a long text's, ~2,000 segments each, a dozen a key):
        # frozen out of the collector's reach as at mount, once the young generations are
        # collected. Without it (the mount's freeze alone) full collections scan what was
        # drawn since: 12 in the bench's 52 s at ~10 ms of CPU (max 24), 5 in --long 2048
        # --rounds 1 at ~17 ms (max 31); with it, none.
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
                self.call_from_thread(self._rows_done, error_line(exc))
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

    # --- keys -----------------------------------------------------------------------

    def action_move_query(self, step: int) -> None:
        self.session.step_query(step)
        self.refresh_view()

    def action_move_layer(self, step: int) -> None:
        self.session.step_layer(step)
        self.refresh_view()

    def action_move_head(self, step: int) -> None:
        self.session.step_head(step)
        self.refresh_view()

    def action_next_view(self) -> None:
        self.session.next_view()
        self.refresh_view()

    def action_view(self, view: str) -> None:
        refused = self.session.show_view(view)
        if refused is not None:
            self.say(refused)
            return
        self.refresh_view()

    def action_toggle_values(self) -> None:
        self.session.toggle_values()
        self.refresh_view()

    def action_toggle_reading(self, option: str) -> None:
        self.session.toggle_reading(option)
        self.refresh_view()

    def action_toggle_measure(self) -> None:
        refused = self.session.toggle_measure()
        if refused is not None:
            self.say(refused)
            return
        self.refresh_view()
        from ..measures.base import measure_named

        m = measure_named(self.measure)
        self.say(f"measure: {m.name if m.sums_to_one else f'{m.share_label}s ‖α·f(x)‖ ({m.citation})'}")

    def action_scroll(self, where: str) -> None:
        body = self.query_one("#view", Lines)
        {"page_up": body.scroll_page_up, "page_down": body.scroll_page_down}.get(
            where, body.scroll_home if where == "home" else body.scroll_end
        )(animate=False)

    def action_keys(self) -> None:
        self.push_screen(KeysScreen())

    # --- ablation and explain (a, x) ------------------------------------------------

    def _raw_place(self) -> tuple[Tokens, int]:
        """The engine's tokens of the sentence and the cursor's raw query position (a
        merged word: its first piece)."""
        tokens = self.long.raw_tokens if self.long is not None else self.raw.tokens
        return tokens, raw_position(self.att, self.cursor.query)

    def action_ablate(self) -> None:
        if self._ablate is None:
            self.say("this explorer has no model to ablate heads with")
            return
        tokens, query = self._raw_place()
        ablate = self._ablate
        self._analyse("ablate", (tokens.text, "ablate", query), lambda: ablate(tokens, query))

    def action_explain(self) -> None:
        if self._explain is None:
            self.say("this explorer has no model to explain a head with")
            return
        c = self.cursor
        if c.head >= self.raw.num_heads:
            self.say(f"{self.att.head_name(c.head)} is not one head: move to a head with [ or ] to explain it")
            return
        tokens, query = self._raw_place()
        explain = self._explain
        self._analyse(
            "explain", (tokens.text, "explain", query, c.layer, c.head), lambda: explain(tokens, query, c.layer, c.head)
        )

    def _analyse(self, kind: str, key: tuple[Any, ...], work: Callable[[], Any]) -> None:
        """Show ``kind``'s answer for the cursor: kept, or computed by ``work`` in a worker."""
        if key in self._answers:
            self._show_answer(kind, key, self._answers[key])
            return
        if "analysis" in self._busy:
            self.say("still computing the previous ablation or explanation…")
            return
        self._busy.add("analysis")
        cursor = self.cursor
        what = "ablating each head" if kind == "ablate" else f"explaining layer {cursor.layer} head {cursor.head}"
        self.say(f"{what} at token {cursor.query} {self.att.tokens.labels[cursor.query]!r}…")

        def run() -> None:
            try:
                answer = work()
            except AttnvizError as exc:
                self.call_from_thread(self._done, "analysis", error_line(exc))
            except Exception as exc:  # a bug must not kill the session
                self.call_from_thread(self._done, "analysis", f"error: {type(exc).__name__}: {exc}")
            else:
                self.call_from_thread(self._answered, kind, key, cursor, answer)

        self.run_worker(run, thread=True, group="analysis")

    def _answered(self, kind: str, key: tuple[Any, ...], cursor: Cursor, answer: Any) -> None:
        self._busy.discard("analysis")
        self._answers[key] = answer
        if cursor == self.cursor and key[0] == self._raw_place()[0].text:  # the user has not moved since
            self._show_answer(kind, key, answer)
        else:
            self.say(f"{'ablation' if kind == 'ablate' else 'explanation'} ready: press {kind[0]} to see it")

    def _show_answer(self, kind: str, key: tuple[Any, ...], answer: Any) -> None:
        c, att = self.cursor, self.att
        word = att.tokens.labels[c.query]
        if kind == "ablate":
            effects: HeadEffects = answer
            head = c.head if c.head < self.raw.num_heads else None
            names = [att.head_name(h) for h in range(self.raw.num_heads)]
            drawn = strips(ablation_view(effects, c.layer, word, head, names), self._view_width())
            self.say(f"ablation of layer {c.layer}'s heads at {word!r}")
        else:
            drawn = strips(explain_screen(answer), self._view_width())
            self.say(f"layer {c.layer} head {c.head} explained for {word!r}")
        self._warm_round += 1  # drawing ahead stands down while the answer is read
        self._warm_queue = []
        body = self.query_one("#view", Lines)
        body.show(drawn)
        body.scroll_home(animate=False)
        self.panel = kind

    # --- a new sentence -------------------------------------------------------------

    def action_ask(self) -> None:
        if self.session.run is None:
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
        elif self.panel is not None:  # Esc leaves an analysis' screen too
            self.refresh_view()

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
            # Read as the user reads now and draw the view the cursor will land on, off the event loop.
            raw, read = self.session.read_sentence(sentence, self._view_width(), self.color)
        except AttnvizError as exc:
            self.call_from_thread(self._done, "run", error_line(exc))
        except Exception as exc:  # a bug must not kill the session: say it and keep the old sentence
            self.call_from_thread(self._done, "run", f"error: {type(exc).__name__}: {exc}")
        else:
            self.call_from_thread(self._loaded, raw, read)

    def _loaded(self, raw: DrawnViews, read: DrawnViews) -> None:
        self._busy.discard("run")
        self.session.load(raw, read)
        self._show_header()
        self.refresh_view()
        self.query_one("#tokens", Static).refresh(layout=True)  # a new sentence may wrap differently
        self.say(f"new sentence: {len(self.att.tokens)} tokens")

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
            self.call_from_thread(self._done, "export", error_line(exc))
        except Exception as exc:
            self.call_from_thread(self._done, "export", f"error: {type(exc).__name__}: {exc}")
        else:
            note = " (the head table's layer, as a token heatmap)" if cursor.view == "table" else ""
            self.call_from_thread(self._done, "export", f"wrote {path}{note}")


def explore(att: Attention, run: Callable[[str], Attention] | None = None, **options: Any) -> None:
    """Run the explorer in the terminal until the user quits."""
    ExploreApp(att, run, **options).run()
