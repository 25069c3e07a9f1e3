"""Terminal views built with rich: per-head heatmap grids of one token's attention.

Renderers take data (an ``Attention``), never models, and return rich renderables;
test them with ``Console(record=True)``. Colour is a perceptually uniform ramp
(viridis) on an absolute 0..1 scale, so shades mean the same in every layer; without
colour (NO_COLOR, a pipe) the cells fall back to shade glyphs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text

from ...measures.base import measure_named
from ...measures.findings import Link, strongest_links
from ...measures.metrics import DEFAULT_EXCLUDE
from ...result import Attention, Provenance
from .compact import MAX_GRID_BLOCKS, compact_layer, grid_blocks
from .glyphs import _SHADES, _VIRIDIS, MARK, MASKED, PAIR_RULE, colour, shade

__all__ = ["MARK", "MASKED", "PAIR_RULE", "_SHADES", "_VIRIDIS", "colour", "shade"]


def weight_style(weight: float, bold: bool = False) -> Style:
    """The one colour rule of a weight cell: its viridis colour behind, black text on the
    light end (above 0.55), white on the dark end."""
    return Style(color="black" if weight > 0.55 else "white", bgcolor=colour(weight), bold=bold)


def uses_colour(console: Console) -> bool:
    """Whether views printed on ``console`` are drawn in colour. rich keeps a colour
    system under NO_COLOR but drops background colours, which would leave blank cells:
    the views then use their glyph fallback instead."""
    return console.color_system is not None and not console.no_color


def colour_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """rich ``Console`` arguments for the colour the environment asks for.

    NO_COLOR (any non-empty value, no-color.org) wins over everything. FORCE_COLOR
    (non-empty) draws colour even into a pipe or a file, and in true colour, since the
    heatmap is a continuous ramp that 8 colours cannot show. COLORTERM=truecolor/24bit
    picks true colour on a terminal (rich reads it); alone it does not colour a pipe, as
    terminals export it to every program they start."""
    if env.get("NO_COLOR"):
        return {}
    if env.get("FORCE_COLOR"):
        return {"force_terminal": True, "color_system": "truecolor"}
    return {}


def for_console(console: Console) -> dict[str, Any]:
    """The ``width`` and ``color`` a view printed on ``console`` is drawn for."""
    return {"width": console.width, "color": uses_colour(console)}


def provenance_line(p: Provenance) -> str:
    """The one header of a view: 'all-MiniLM-L6-v2 · engine own · cpu · 6 layers × 12 heads'."""
    return f"{p.model} · engine {p.engine} · {p.device} · {p.num_layers} layers × {p.num_heads} heads"


def _cell(weight: float, width: int, *, strongest: bool, values: bool, color: bool, masked: bool) -> Text:
    if masked:
        return Text(MASKED.center(width), style="dim")
    if values:
        body = f"{weight:.2f}".lstrip("0") if weight < 1 else "1.0"
        body = (body + MARK) if strongest else body
    else:
        body = MARK if strongest else ("" if color else shade(weight) * 3)
    text = body.center(width)
    if not color:
        return Text(text, style="bold" if strongest else "")
    return Text(text, style=weight_style(weight, bold=strongest))


def _chunks(widths: list[int], room: int) -> Iterator[range]:
    """Split token columns into runs that fit ``room`` terminal columns."""
    start, used = 0, 0
    for i, w in enumerate(widths):
        if i > start and used + w + 1 > room:
            yield range(start, i)
            start, used = i, 0
        used += w + 1
    yield range(start, len(widths))


def _cut(label: str, width: int) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


# Token labels longer than this are cut with "…" when the sentence would not fit the
# terminal in one block at full length; on a wide terminal they are printed whole.
_CUT_LABEL = 8
_FULL_LABEL = 24


def token_heatmap(
    att: Attention,
    query: int,
    layer: int,
    *,
    values: bool = False,
    color: bool = True,
    width: int = 120,
    heads: Sequence[int] | None = None,
    selected: int | None = None,
    effects: np.ndarray | None = None,
) -> RenderableType:
    """One layer: rows = heads (then any aggregate slots), columns = tokens (or words),
    cell = weight of ``query`` -> token.

    ``selected``: a head slot whose label is shown reversed with a ▸ (the explorer's cursor).
    ``effects``: (N_model, H) head-ablation effects at this query (``show --ablate``),
    each shown beside its head's strongest target.

    The strongest target of each row is marked with ◆ and named in the second column.
    Tokens set aside (``att.hidden``) are left out. For causal models, tokens after the
    query cannot be attended to and show as -. Blocks that wrap keep the gutter (head
    and strongest columns) so the token columns line up under it.
    """
    slot = att.query_slot(query)
    span = att.query_span(slot)
    rows = att.rows(query)[att.layer_slot(layer)]  # (H, S)
    slots = [*(range(att.model_heads) if heads is None else heads), *range(att.model_heads, att.num_heads)]
    hidden = set(att.hidden)
    cols = [i for i in range(len(att.keys)) if i not in hidden]
    labels = att.keys.labels  # the columns: the source tokens, for cross-attention
    p = att.provenance
    cell_w = 5 if values else 3
    names = [att.head_name(h) for h in slots]
    head_w = max(len(n) for n in names) + (selected is not None)
    # Learned sink logits: the share no token received (NaN where it is not defined).
    sink = att.sink_share()[att.layer_slot(layer), :, slot] if p.attention_sinks else None  # (H,)

    def tops_for(cut: int) -> list[str]:
        out = []
        for h in slots:
            best = max(cols, key=lambda i: (rows[h, i], -i))
            top = f" {_cut(labels[best], cut)} {rows[h, best]:.2f}"
            if sink is not None and not np.isnan(sink[h]):
                top += f" · logit sink {sink[h]:.2f}"
            if effects is not None and h < att.model_heads and not np.isnan(effects[layer, h]):
                top += f" · effect {effects[layer, h]:.3f}"
            out.append(top)
        return out

    # Whole labels unless cutting them saves a block (a wrap) on this terminal.
    layouts = []
    for cut in (_FULL_LABEL, _CUT_LABEL):
        widths = {i: max(cell_w, min(len(labels[i]), cut)) for i in cols}
        tops = tops_for(min(cut, 10) if cut == _CUT_LABEL else cut)
        top_w = max(len(t) for t in tops) + 1
        blocks = len(list(_chunks([widths[i] for i in cols], max(width - head_w - top_w - 2, 20))))
        layouts.append((blocks, widths, tops, top_w))
    full, cut_ = layouts
    _, widths, tops, top_w = full if full[0] <= cut_[0] else cut_
    # Sentence B of a pair starts at this column: a rule before it (tokens, not merged words).
    boundary = att.keys.pair_start if att.key_pieces is None else None
    if boundary in widths:
        widths[boundary] += 1
    kind = "word" if att.key_pieces is not None else "token"
    who = " ".join(att.tokens.labels[i] for i in span)
    where = f"{kind} {span[0]}" if len(span) == 1 else f"{kind}s {span[0]}-{span[-1]}, averaged"
    key_kind = "source token" if att.part == "cross" and kind == "token" else kind
    title = f"layer {layer} · {who!r} ({where}) → each {key_kind}"
    if measure_named(att.measure).needs_values:
        title += f" · {_measure_label(att)}"
    if p.causal:
        title += f" · causal: later {kind}s ({MASKED}) are masked"
    if p.attention_sinks and not att.hidden:
        title += " · rows sum to 1 - the logit sink"
    tables: list[RenderableType] = []
    column_widths = [widths[i] for i in cols]
    for chunk in _chunks(column_widths, max(width - head_w - top_w - 2, 20)):
        first = chunk.start == 0
        table = Table(
            title=title if first else None,
            title_justify="left",
            box=None,
            padding=(0, 0),
            pad_edge=False,
            collapse_padding=True,
            show_edge=False,
            header_style="",  # so the query token (bold) and specials (dim) stand out
        )
        table.add_column("", justify="right", no_wrap=True, width=head_w + 1)
        # The answer first, the detail after; continuation blocks keep the gutter blank.
        table.add_column("strongest" if first else "", no_wrap=True, width=top_w)
        for c in chunk:
            i = cols[c]
            if i == boundary:
                table.add_column(PAIR_RULE, no_wrap=True, width=1)
            w = widths[i] - (i == boundary)
            # The query's own column is bold; cross-attention's keys are another text.
            own = i in span and att.is_self_attention
            style = "bold" if own else ("dim" if att.keys.special[i] else "")
            table.add_column(Text(_cut(labels[i], w), style=style), justify="center", no_wrap=True, width=w + 1)
        for k, h in enumerate(slots):
            row = rows[h]
            best = max(cols, key=lambda i: (row[i], -i))
            if h == selected:  # reversed and marked, so the cursor shows without colour too
                name = Text("▸" + names[k] + " ", style="bold reverse")
            else:
                name = Text(names[k] + " ", style="dim" if h < att.model_heads else "dim italic")
            cells: list[RenderableType] = [name, Text(tops[k] if first else "")]
            for c in chunk:
                i = cols[c]
                if i == boundary:
                    cells.append(Text(PAIR_RULE))
                masked = p.causal and i > max(span)
                w = widths[i] - (i == boundary)
                cells.append(_cell(float(row[i]), w, strongest=i == best, values=values, color=color, masked=masked))
            table.add_row(*cells)
        tables.append(table)
    return Group(*tables, Text(""))


def matrix_heatmap(
    att: Attention,
    layer: int,
    head: int,
    *,
    query: int | None = None,
    values: bool = False,
    color: bool = True,
    width: int = 120,
) -> RenderableType:
    """One head slot's query × key matrix: rows = kept query tokens (or words), columns =
    tokens (those set aside, ``att.hidden``, left out).

    Each row's strongest target is marked with ◆; the row of ``query`` (if given) is
    labelled reversed with a ▸. For causal models a query's later tokens show as -.
    """
    mat = att.matrix(layer)[head]  # (Q, S)
    labels = att.tokens.labels
    hidden = set(att.hidden)
    cols = [i for i in range(len(att.tokens)) if i not in hidden]
    p = att.provenance
    cell_w = 5 if values else 3
    widths = [max(cell_w, min(len(labels[i]), _CUT_LABEL)) for i in cols]
    names = [_cut(labels[q], 10) for q in att.queries]
    row_w = max(len(n) for n in names) + 2
    kind = "word" if att.key_pieces is not None else "token"
    title = f"layer {layer} · {att.head_name(head)} · each {kind} (row) → each {kind} (column)"
    if measure_named(att.measure).needs_values:
        title += f" · {_measure_label(att)}"
    if p.causal:
        title += f" · causal: later {kind}s ({MASKED}) are masked"
    # The title on its own line: as a Table title it would wrap at a narrow table's width.
    tables: list[RenderableType] = [Text(title)]
    for chunk in _chunks(widths, max(width - row_w - 1, 20)):
        table = Table(box=None, padding=(0, 0), pad_edge=False, collapse_padding=True, show_edge=False, header_style="")
        table.add_column("", justify="right", no_wrap=True, width=row_w)
        for c in chunk:
            i = cols[c]
            style = "bold" if i == query else ("dim" if att.tokens.special[i] else "")
            table.add_column(
                Text(_cut(labels[i], widths[c]), style=style), justify="center", no_wrap=True, width=widths[c] + 1
            )
        for slot, q in enumerate(att.queries):
            row = mat[slot]  # (S,)
            best = max(cols, key=lambda i: (row[i], -i))
            if q == query:
                name = Text("▸" + names[slot] + " ", style="bold reverse")
            else:
                name = Text(names[slot] + " ", style="dim" if att.tokens.special[q] else "")
            cells: list[RenderableType] = [name]
            for c in chunk:
                i = cols[c]
                masked = p.causal and i > q
                cells.append(
                    _cell(float(row[i]), widths[c], strongest=i == best, values=values, color=color, masked=masked)
                )
            table.add_row(*cells)
        tables.append(table)
    return Group(*tables, Text(""))


def _steps_beside_notes(att: Attention) -> list[str]:
    """The reading's steps, less the norm shares' step where NORM_NOTE already says it
    (``--measure norm`` explained itself twice, once per line)."""
    from ...transforms import SHARES_STEP

    return [s for s in att.steps if not (not measure_named(att.measure).sums_to_one and s == SHARES_STEP)]


NORM_NOTE = (
    "measure norm: ‖α·f(x)‖ with f(x) = (x·W_V + b_V)·W_O, the size of what each token adds to the "
    "head's output (Kobayashi et al. 2020); cells are each row's shares"
)

SCORE_TERMS = {
    "c2c": "content→content",
    "c2p": "content→position (c2p)",
    "p2c": "position→content (p2c)",
}


def score_note(terms: Sequence[str]) -> str:
    """'scores sum content→content + content→position (c2p) + ...' (DeBERTa's disentangled attention)."""
    named = " + ".join(SCORE_TERMS.get(t, t) for t in terms)
    missing = [SCORE_TERMS[t] for t in ("c2p", "p2c") if t not in terms]
    note = f"disentangled attention: each score sums {named}"
    return note + (f"; this checkpoint has no {' or '.join(missing)} term" if missing else "")


def pair_note(att: Attention) -> str:
    """Where sentence B of a pair starts, for the reader of the heatmaps."""
    start = att.keys.pair_start
    first = att.keys.labels[start] if start is not None else "?"
    return f"sentence pair: {PAIR_RULE} marks where sentence B (token type 1) starts, at token {start} ({first!r})"


def written_note(att: Attention) -> str | None:
    """The legend of a generation's view: which tokens the model wrote (``--generate``)."""
    from .. import written_legend

    return written_legend(att.tokens)


def part_note(att: Attention) -> str:
    """Which attention of an encoder-decoder is shown, and over which text."""
    if att.part == "cross":
        return f"cross-attention: decoder token → source token · target {att.tokens.text!r} · source {att.keys.text!r}"
    if att.part == "decoder":
        return f"decoder self-attention (causal) · target {att.tokens.text!r}"
    return f"encoder self-attention · source {att.tokens.text!r}"


def _measure_label(att: Attention) -> str:
    from ...transforms import measure_label

    return measure_label(att)


def legend(color: bool = True, measure: str = "weight", compact: bool = False) -> Text:
    """'weight 0 ▕colours▏ 1   ◆ strongest target of the head' (``measure``: what a cell is;
    ``compact``: the strip's key, '▼ the query · a special token (dimmed) - masked', instead of the ◆)."""
    text = Text(f"{measure} 0 ")
    for w in np.linspace(0, 1, 11):
        text.append("  " if color else shade(float(w)) * 2, style=Style(bgcolor=colour(float(w))) if color else "")
    text.append(" 1    ")
    if compact:
        text.append("▼ the query   · a special token (dimmed)   - masked")
        return text
    text.append(MARK, style="bold")
    text.append(" strongest target of each head")
    return text


def links_text(
    att: Attention, slot: int, links: Sequence[Link], exclude: Sequence[str], effects: np.ndarray | None = None
) -> Text:
    """The strongest links of one query, a line each: layer, head, target, weight (and,
    with ``effects`` (N_model, H) from ``show --ablate``, what removing the head does)."""
    who = " ".join(att.tokens.labels[i] for i in att.query_span(slot))
    left_out = {"special": "special tokens", "punct": "punctuation", "adjacent": "neighbours"}
    # Cross-attention's keys are the source: no neighbours of the query to leave out.
    shown = ("special", "punct", "adjacent") if att.is_self_attention else ("special", "punct")
    kinds = [left_out[k] for k in shown if k in exclude]
    text = Text(f"strongest links of {who!r}")
    # The effect that a head must reach to be among the five that matter most.
    top = float(np.sort(np.nan_to_num(effects, nan=-1.0).ravel())[-5]) if effects is not None else 0.0
    if kinds:
        text.append(", not to " + (", ".join(kinds[:-1]) + " or " + kinds[-1] if len(kinds) > 1 else kinds[0]))
    text.append(":" if links else ": none")
    names = [f"layer {x.layer} head {x.head.removeprefix('h')}" for x in links]
    targets = [repr(x.target) for x in links]
    for name, target, x in zip(names, targets, links):
        text.append("\n  ")
        text.append(name.ljust(max(map(len, names))), style="bold")
        text.append(f"  → {target.ljust(max(map(len, targets)))}  {x.weight:.2f}")
        head = (
            int(x.head.removeprefix("h"))
            if x.head.removeprefix("h").isascii() and x.head.removeprefix("h").isdigit()
            else None
        )
        if effects is not None and head is not None and not np.isnan(effects[x.layer, head]):
            text.append(f"  effect {effects[x.layer, head]:.3f}", style="bold" if effects[x.layer, head] >= top else "")
    if effects is not None:
        text.append(
            "\n  effect: 1 − cos of the token's final hidden state with the head removed before W^O; "
            "bold: among the 5 heads that matter most",
            style="dim",
        )
    return text


COMPACT_NOTE = (
    "compact view: the row does not fit two wrapped blocks; each head's strongest keys and its whole row "
    "binned (--full for the grid, --top-keys K)"
)


def render_show(
    att: Attention,
    queries: Sequence[int],
    *,
    width: int,
    color: bool,
    values: bool = False,
    heads: Sequence[int] | None = None,
    links: int = 5,
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    effects: Mapping[int, np.ndarray] | None = None,
    full: bool = False,
    top_keys: int | None = None,
) -> Group:
    """show's answer, to print: the provenance line and notes, every kept layer's
    heatmap for each query (token positions in ``att``), then a legend and, per query,
    the ``links`` strongest links that are not to ``exclude``d tokens (see
    attnviz.measures.findings). ``width``/``color``: ``for_console(console)``. ``effects``: per
    query, its (N_model, H) head-ablation effects (``show --ablate``), beside each head's
    row and each link.

    A row that would wrap into more than two blocks is drawn compact (one line per head:
    its ``top_keys`` strongest keys and a binned strip, ``attnviz.render.terminal.compact``) unless
    ``full``."""
    p = att.provenance
    parts: list[RenderableType] = [Text(provenance_line(p), style="dim")]
    if measure_named(att.measure).needs_values:
        parts.append(Text(NORM_NOTE, style="dim"))
    if att.part is not None:
        parts.append(Text(part_note(att), style="dim"))
    if att.keys.pair_start is not None and att.key_pieces is None:
        parts.append(Text(pair_note(att), style="dim"))
    if (written := written_note(att)) is not None:
        parts.append(Text(written, style="dim"))
    if p.score_terms:
        parts.append(Text(score_note(p.score_terms), style="dim"))
    parts += [Text(note, style="dim") for note in p.shape.notes()]
    parts += [Text(step, style="dim") for step in _steps_beside_notes(att)]
    compact = not full and grid_blocks(att, width, values) > MAX_GRID_BLOCKS
    if compact:
        parts.append(Text(COMPACT_NOTE, style="dim"))
    for q in queries:
        for layer in att.layers:
            if compact:
                parts.append(
                    compact_layer(
                        att,
                        q,
                        layer,
                        width=width,
                        top_keys=top_keys,
                        color=color,
                        heads=heads,
                        effects=None if effects is None else effects.get(q),
                    ).renderable()
                )
            else:
                parts.append(
                    token_heatmap(
                        att,
                        q,
                        layer,
                        values=values,
                        color=color,
                        width=width,
                        heads=heads,
                        effects=None if effects is None else effects.get(q),
                    )
                )
    parts.append(legend(color, _measure_label(att), compact))
    if links > 0:
        for q in queries:
            slot = att.query_slot(q)
            found = strongest_links(att, slot, links, exclude, heads=heads)
            parts.append(links_text(att, slot, found, exclude, None if effects is None else effects.get(q)))
    return Group(*parts)


@contextlib.contextmanager
def paged(console: Console, enabled: bool = True) -> Iterator[None]:
    """Send what ``console`` prints inside the block through a pager, as git does: only
    when ``enabled`` and stdout is a terminal; ``less`` gets ``LESS=FRX`` unless the user
    set LESS (quit when it fits one screen, keep colours, leave the text on screen)."""
    if not enabled or not console.is_terminal:
        yield
        return
    os.environ.setdefault("LESS", "FRX")
    with console.pager(styles=console.color_system is not None):
        yield
