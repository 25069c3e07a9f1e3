"""The notebook renderer: the self-contained HTML page (``render.html``) inline in a
notebook cell, and the live widget's page.

Every notebook front end (Jupyter Notebook 7, JupyterLab 4, VS Code, Colab) renders a
``text/html`` output without a widget manager; none of them lets two copies of the same
page share one document safely (ids, globals, the page's Content-Security-Policy). So the
page goes into an ``<iframe srcdoc=...>`` of its own, sandboxed to ``allow-scripts`` only:
its script runs with an opaque origin, cannot reach the notebook, and its CSP (no
network, inline script and style only) holds as it does in the exported file.

    frame(att, ...)        the iframe's markup, or a message when the page cannot be drawn
    NotebookView           what ``Attention.show()`` returns: displays itself in a cell
    page_problem(att)      why an ``Attention`` cannot become the page, or None

The size budget is the exported page's (``render.HTML_BUDGET_BYTES``): past it the cell
shows a message saying so, never a page that would freeze the browser.

numpy + stdlib only (and render.html); IPython and anywidget are imported by the widget
(``attnviz.widget``) alone.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import AttnvizError
from ..measures.base import measure_named
from ..tokens import find_word
from . import HTML_BUDGET_BYTES
from .html import VIEWS, Options, check_page_size, html_page

# px: the frame's height until its page reports its own (FIT_SCRIPT), and where scripts do
# not run in the notebook's document (then the frame's resize handle shows the rest).
DEFAULT_HEIGHT = 640


def page_problem(att: Any) -> str | None:
    """Why ``att`` cannot be drawn as the page, in words, or None when it can.

    The page computes its reading options itself from raw per-token matrices, so it needs
    every token's row and the engine's weights as they came (no option applied).
    """
    measure = getattr(att, "measure", "weight")
    if measure_named(measure).needs_values:
        # Drawn as weights, norms (not on [0, 1]) were clipped and labelled "weight".
        return (
            f"this Attention holds the {measure} measure, not attention weights, and the interactive view "
            "draws norms only beside the weights they come from: compute the view with "
            "attnviz.inspect(text) (the weights), or export a page with both (attnviz export TEXT -o page.html "
            "--measure norm)"
        )
    n_tok = len(att.tokens)
    if tuple(att.queries) != tuple(range(n_tok)):
        return (
            f"this Attention holds the rows of {len(att.queries)} of its {n_tok} tokens, and the interactive "
            "view needs every row: compute it without a token (attnviz.inspect(text)), then pin one with "
            "att.show(token=...)"
        )
    if att.steps or att.aggregates:
        return (
            f"this Attention was read with options ({', '.join(att.steps) or ', '.join(att.aggregates)}); the "
            "interactive view applies words, hidden special tokens and the head mean itself: compute it "
            "without them and switch them on in the view"
        )
    if not att.is_self_attention:
        return "the interactive view draws self-attention; cross-attention (queries and keys differ) is not drawn"
    return None


def message(text: str) -> str:
    """A short notice in a cell, in place of the view (escaped; no script)."""
    return (
        '<div class="attnviz-message" style="border-left:4px solid #c0392b;padding:6px 10px;'
        'font-family:system-ui,sans-serif;font-size:13px;background:#fdf2f0">'
        f"<b>attnviz</b>: {html.escape(text)}</div>"
    )


def query_position(att: Any, token: str | int | None) -> int | None:
    """The token position ``token`` names: a position, a word (its first piece), or None.

    Raises:
        UsageError: a position out of range; TokenNotFoundError: a word not in the text
            or repeated (see ``tokens.find_word``).
    """
    if token is None or isinstance(token, int) and not isinstance(token, bool):
        return token
    if not isinstance(token, str):
        from ..errors import UsageError

        raise UsageError(f"token must be a word or a position, not {type(token).__name__}")
    word, sep, nth = token.rpartition(":")
    # ASCII digits only: "²".isdigit() is true and int() refuses it; "١" reads as 1.
    if sep and nth.isascii() and nth.isdigit() and word:
        return find_word(att.tokens, word, int(nth))[0]
    return find_word(att.tokens, token)[0]


def frame(
    att: Any,
    view: str = "head",
    layer: int | None = None,
    token: str | int | None = None,
    options: Options | None = None,
    *,
    height: int = DEFAULT_HEIGHT,
    budget: int = HTML_BUDGET_BYTES,
) -> str:
    """The page for ``att`` in a sandboxed iframe (``srcdoc``), opening on ``view``,
    ``layer`` (a model layer) and ``token`` (pinned: a word, ``WORD:N`` or a position),
    followed by ``FIT_SCRIPT``: the frame opens ``height`` px tall and takes its page's
    height once the page has laid itself out, footer included.

    Never raises for what a user can cause: an Attention the page cannot draw, a page over
    ``budget`` bytes or a bad initial state come back as a message in the cell.
    """
    rows = _raw_rows(att)
    problem = None if rows else page_problem(att)
    if problem is not None:
        return message(problem)
    if view not in VIEWS:
        return message(f"unknown view {view!r} (known: {', '.join(VIEWS)})")
    try:
        if rows:
            page = _row_page(att, view, layer, token, options, budget)
        else:
            try:
                check_page_size(len(att.layers), att.num_heads, len(att.tokens), budget)
            except AttnvizError:
                if token is None:
                    raise
                # Row mode (issue 22): the pinned token's rows (its word's pieces) in every layer.
                from ..transforms import select
                from .html.rows import row_positions

                pinned = query_position(att, token)
                picked = select(att, queries=row_positions(att.tokens, [] if pinned is None else [pinned]))
                page = _row_page(picked, view, layer, token, options, budget)
            else:
                page = html_page(att, query_position(att, token), view, layer, options=options)
    except AttnvizError as exc:
        return message(str(exc))
    title = html.escape(f"attnviz: {att.tokens.text.strip()[:80]}")
    # srcdoc holds the whole page as an attribute value: escaping & < > " ' keeps it one
    # attribute whatever the sentence says. allow-scripts alone: an opaque origin, no
    # access to the notebook, no forms, no pop-ups, no top-level navigation.
    return (
        f'<iframe class="attnviz-view" title="{title}" sandbox="allow-scripts" '
        f'style="width:100%;height:{int(height)}px;border:1px solid #ddd;resize:vertical" '
        f'srcdoc="{html.escape(page, quote=True)}"></iframe>' + FIT_SCRIPT
    )


# The cell's side of the page's height message (assets/common.js): the frame takes the height
# its page reports, so the footer shows. A sandboxed srcdoc page has an opaque origin, so its
# parent cannot measure it; the page posts {attnviz: "height", height} and this listener sets
# the height of the attnviz frame whose window sent it (any other message, or a frame that is
# not ours, is ignored). One listener per document, however many views the notebook holds;
# inline, no CDN, so it runs offline in nbconvert's HTML, Notebook 7, JupyterLab (trusted
# outputs run their scripts) and VS Code. Where scripts do not run, the frame keeps
# ``height`` px and its resize handle.
FIT_SCRIPT = (
    "<script>(function(){if(window.attnvizFit)return;window.attnvizFit=true;"
    'window.addEventListener("message",function(e){var d=e.data;'
    'if(!d||d.attnviz!=="height"||typeof d.height!=="number"||!isFinite(d.height))return;'
    'var fs=document.querySelectorAll("iframe.attnviz-view");'
    "for(var i=0;i<fs.length;i++){if(fs[i].contentWindow===e.source){"
    'fs[i].style.height=Math.max(120,Math.min(20000,Math.ceil(d.height)))+"px";}}});})();</script>'
)


def _raw_rows(att: Any) -> bool:
    """True when ``att`` holds some tokens' raw rows (no option applied) of self-attention:
    the row-mode page draws it."""
    partial = tuple(att.queries) != tuple(range(len(att.tokens)))
    raw = not (att.steps or att.aggregates) and not measure_named(getattr(att, "measure", "weight")).needs_values
    return bool(partial and raw and att.is_self_attention and len(att.queries))


def _row_page(
    att: Any, view: str, layer: int | None, token: str | int | None, options: Options | None, budget: int
) -> str:
    """The row-mode page of ``att`` (``render.html.rows``), the size checked first."""
    from .html.rows import RowPage, check_row_page
    from .html.rows import html_page as row_page

    n_layers, heads, n_rows, n_tok = att.weights.shape
    bits = check_row_page(n_layers, heads, n_rows, n_tok, 0, budget)
    o = options or Options()
    query = query_position(att, token)
    opens = RowPage(query, view, layer, o.head, o.words, o.hide_special, o.mean)
    return row_page(att, None, opens, bits)


@dataclass(frozen=True)
class NotebookView:
    """One view of an ``Attention`` for a notebook cell: the iframe markup (or a message)
    and a one-line text for front ends that show no HTML."""

    html: str
    text: str

    def _repr_html_(self) -> str:
        return self.html

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": self.html, "text/plain": self.text}

    def __repr__(self) -> str:
        return self.text


def summary(att: Any) -> str:
    """One line for ``text/plain``: what the weights are and where they came from."""
    p = att.provenance
    n, h, q, s = att.weights.shape
    return (
        f"<attnviz.Attention {p.model} ({p.engine}): {n} layers × {h} heads × {q} queries × {s} keys "
        f"of {att.tokens.text.strip()[:60]!r}>"
    )


def show(
    att: Any,
    view: str = "head",
    layer: int | None = None,
    token: str | int | None = None,
    options: Options | Mapping[str, Any] | None = None,
    *,
    height: int = DEFAULT_HEIGHT,
    budget: int = HTML_BUDGET_BYTES,
) -> NotebookView:
    """``att`` as a ``NotebookView`` (see ``frame``). ``options``: an ``Options``, or its
    fields by name (``Attention.show``'s keywords); a value of the wrong kind is a message
    in the cell, as every other bad initial state is."""
    if options is not None and not isinstance(options, Options):
        try:
            options = Options(**options)
        except AttnvizError as exc:
            return NotebookView(message(str(exc)), summary(att))
    return NotebookView(frame(att, view, layer, token, options, height=height, budget=budget), summary(att))


def generation_view(gen: Any, *, height: int = DEFAULT_HEIGHT, budget: int = HTML_BUDGET_BYTES) -> NotebookView:
    """A ``generation.Generation`` in a cell: the prompt with the continuation after it
    (written text underlined in colour, the legend beside it), then the written tokens'
    rows as the row-mode page (an encoder-decoder's: its decoder self-attention), opening
    on the first written token."""
    from . import written_legend

    stopped = "partial: interrupted" if gen.partial else f"stopped: {gen.stopped}"
    given = "source" if gen.seq2seq else "prompt"
    written = gen.tokens.text if gen.seq2seq else gen.tokens.text[len(gen.prompt.text) :]  # with its space
    line = (
        f'<div class="attnviz-generation" style="font-family:sans-serif;margin:4px 0">'
        f'<span title="{given}">{html.escape(gen.prompt.text)}</span>{" → " if gen.seq2seq else ""}'
        f'<span title="written by the model" style="color:#b3261e;text-decoration:underline">'
        f'{html.escape(written)}</span> <small style="color:#666">({stopped}; '
        f"{html.escape(written_legend(gen.tokens) or '')})</small></div>"
    )
    text = f"<attnviz.Generation {len(gen.ids)} tokens written after {gen.prompt.text.strip()[:60]!r}: {gen.text!r}>"
    if not gen.ids:
        return NotebookView(line + message("nothing was written"), text)
    att = gen.attention()
    return NotebookView(line + frame(att, token=gen.positions[0], height=height, budget=budget), text)


# --- the live widget (anywidget) ------------------------------------------------------

WIDGET_JS = "widget.js"  # render/html/assets/: the widget's front end, shipped in the package


def widget(run: Callable[[str], Any], text: str, *, view: str = "head", token: str = "") -> Any:
    """A live view: a text box, a token picker, layer, head, view and the page's reading
    options, over the page of ``run(text)`` (an ``Attention`` of every raw row; the caller
    binds it to one loaded engine). A new text runs ``run`` again (one forward pass);
    every other control re-renders the page from the weights already computed. A text
    ``run`` refuses (an ``AttnvizError``) shows its message in the widget, not a traceback.

    anywidget is imported here, when a widget is made, and nowhere else.
    """
    return _widget_class()(run=run, text=text, view=view, token=token)


def _widget_class() -> Any:
    import anywidget
    import traitlets

    from .html import ASSETS

    class AttentionWidget(anywidget.AnyWidget):
        """The synced state (traitlets): what the controls show and what Python computed."""

        _esm = ASSETS / WIDGET_JS
        text = traitlets.Unicode("").tag(sync=True)
        token = traitlets.Unicode("").tag(sync=True)  # a word, WORD:N, a position, or "" (none pinned)
        layer = traitlets.Int(-1).tag(sync=True)  # a model layer; -1 = the middle one
        head = traitlets.Int(0).tag(sync=True)
        view = traitlets.Unicode("head").tag(sync=True)
        words = traitlets.Bool(False).tag(sync=True)
        hide_special = traitlets.Bool(False).tag(sync=True)
        mean = traitlets.Bool(False).tag(sync=True)
        # Computed by Python, read by the front end:
        labels = traitlets.List(traitlets.Unicode()).tag(sync=True)
        layers = traitlets.List(traitlets.Int()).tag(sync=True)
        num_heads = traitlets.Int(0).tag(sync=True)
        page = traitlets.Unicode("").tag(sync=True)  # the whole page, for the iframe's srcdoc
        error = traitlets.Unicode("").tag(sync=True)  # "" or what was refused, in one line

        def __init__(self, run: Callable[[str], Any], **kwargs: Any) -> None:
            self._run = run
            self.attention: Any = None
            super().__init__(**kwargs)
            self._recompute()
            self.observe(lambda _: self._recompute(), names=["text"])
            self.observe(
                lambda _: self._render(), names=["token", "layer", "head", "view", "words", "hide_special", "mean"]
            )

        def _recompute(self) -> None:
            try:
                att = self._run(self.text)
            except AttnvizError as exc:
                self.error = str(exc)
                return
            self.attention = att
            with self.hold_sync():
                self.labels = list(att.tokens.labels)
                self.layers = list(att.layers)
                self.num_heads = int(att.num_heads)
                if self.layer not in att.layers:
                    self.layer = -1
                if not 0 <= self.head < att.num_heads:
                    self.head = 0
                if self.token and not _finds(att, self.token):
                    self.token = ""
            self._render()

        def _render(self) -> None:
            att = self.attention
            if att is None:
                return
            from .html import html_page

            try:
                layer = None if self.layer == -1 else self.layer
                token: str | int | None = self.token or None
                if isinstance(token, str) and token.isascii() and token.isdigit():
                    token = int(token)
                options = Options(self.head, self.words, self.hide_special, self.mean)
                page = html_page(att, query_position(att, token), self.view, layer, options=options)
            except AttnvizError as exc:
                self.error = str(exc)
                return
            with self.hold_sync():
                self.page = page
                self.error = ""

    return AttentionWidget


def _finds(att: Any, token: str) -> bool:
    try:
        query_position(att, int(token) if token.isascii() and token.isdigit() else token)
    except AttnvizError:
        return False
    return True
