"""Terminal views built with rich: per-head heatmap grids of one token's attention.

Renderers take data (an ``Attention``), never models, and return rich renderables;
test them with ``Console(record=True)``. Colour is a perceptually uniform ramp
(viridis) on an absolute 0..1 scale, so shades mean the same in every layer; without
colour (NO_COLOR, a pipe) the cells fall back to shade glyphs.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text

from ..result import Attention

# viridis at 9 stops (matplotlib's values), interpolated linearly between them.
_VIRIDIS = np.array(
    [
        (68, 1, 84),
        (71, 44, 122),
        (59, 81, 139),
        (44, 113, 142),
        (33, 144, 141),
        (39, 173, 129),
        (92, 200, 99),
        (170, 220, 50),
        (253, 231, 37),
    ],
    dtype=float,
)
_SHADES = " ·░▒▓█"
MARK = "◆"
MASKED = "-"  # not "·", which is a shade glyph
PAIR_RULE = "┃"  # between the two sentences of a pair


def colour(weight: float) -> str:
    """'#rrggbb' of ``weight`` (0..1) on the viridis ramp."""
    x = min(max(float(weight), 0.0), 1.0) * (len(_VIRIDIS) - 1)
    i = min(int(x), len(_VIRIDIS) - 2)
    r, g, b = _VIRIDIS[i] + (x - i) * (_VIRIDIS[i + 1] - _VIRIDIS[i])
    return f"#{round(r):02x}{round(g):02x}{round(b):02x}"


def shade(weight: float) -> str:
    """A glyph for ``weight`` (0..1) when there is no colour: blank below 0.05,
    then · ░ ▒ ▓ █ in steps of 0.2."""
    if weight < 0.05:
        return " "
    return _SHADES[min(1 + int(weight * (len(_SHADES) - 1)), len(_SHADES) - 1)]


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
    fg = "black" if weight > 0.55 else "white"
    return Text(text, style=Style(color=fg, bgcolor=colour(weight), bold=strongest))


def _chunks(widths: list[int], room: int) -> Iterator[range]:
    """Split token columns into runs that fit ``room`` terminal columns."""
    start, used = 0, 0
    for i, w in enumerate(widths):
        if i > start and used + w + 1 > room:
            yield range(start, i)
            start, used = i, 0
        used += w + 1
    yield range(start, len(widths))


def token_heatmap(
    att: Attention,
    query: int,
    layer: int,
    *,
    values: bool = False,
    color: bool = True,
    width: int = 120,
) -> RenderableType:
    """One layer: rows = heads, columns = tokens, cell = weight of ``query`` -> token.

    The strongest target of each head is marked with ◆ and named in the last column.
    For causal models, tokens after the query cannot be attended to and show as -.
    """
    rows = att.rows(query)[att.layer_slot(layer)]  # (H, S)
    labels = att.keys.labels  # the columns: the source tokens, for cross-attention
    query_label = att.tokens.labels[query]
    own_column = query if att.is_self_attention else -1  # the query's own column, if it has one
    p = att.provenance
    cell_w = 5 if values else 3
    widths = [max(cell_w, min(len(label), 8)) for label in labels]
    boundary = att.keys.pair_start  # sentence B of a pair starts here: a rule before its column
    if boundary is not None:
        widths[boundary] += 1
    head_w = max(len(p.shape.head_label(h)) for h in range(rows.shape[0]))
    tops = [f" {labels[int(np.argmax(row))][:10]} {row.max():.2f}" for row in rows]
    top_w = max(len(t) for t in tops) + 1
    title = f"layer {layer} · {query_label!r} (token {query}) → each {_key_noun(att)}"
    if p.causal:
        title += f" · causal: later tokens ({MASKED}) are masked"
    tables: list[RenderableType] = []
    for cols in _chunks(widths, max(width - head_w - top_w - 2, 20)):
        first = cols.start == 0
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
        if first:  # the answer first, the detail after
            table.add_column("strongest", no_wrap=True, width=top_w)
        for i in cols:
            if i == boundary:
                table.add_column(PAIR_RULE, no_wrap=True, width=1)
            w = widths[i] - (i == boundary)
            label = labels[i] if len(labels[i]) <= w else labels[i][: w - 1] + "…"
            style = "bold" if i == own_column else ("dim" if att.keys.special[i] else "")
            table.add_column(Text(label, style=style), justify="center", no_wrap=True, width=w + 1)
        for h, row in enumerate(rows):
            best = int(np.argmax(row))
            cells: list[RenderableType] = [Text(p.shape.head_label(h) + " ", style="dim")]
            if first:
                cells.append(Text(tops[h]))
            for i in cols:
                if i == boundary:
                    cells.append(Text(PAIR_RULE))
                masked = p.causal and i > query
                w = widths[i] - (i == boundary)
                cells.append(_cell(float(row[i]), w, strongest=i == best, values=values, color=color, masked=masked))
            table.add_row(*cells)
        tables.append(table)
    return Group(*tables, Text(""))


def _key_noun(att: Attention) -> str:
    return "source token" if att.part == "cross" else "token"


SCORE_TERMS = {
    "c2c": "content→content",
    "c2p": "content→position (c2p)",
    "p2c": "position→content (p2c)",
}


def score_note(terms: tuple[str, ...]) -> str:
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


def part_note(att: Attention) -> str:
    """Which attention of an encoder-decoder is shown, and over which text."""
    if att.part == "cross":
        return f"cross-attention: decoder token → source token · target {att.tokens.text!r} · source {att.keys.text!r}"
    if att.part == "decoder":
        return f"decoder self-attention (causal) · target {att.tokens.text!r}"
    return f"encoder self-attention · source {att.tokens.text!r}"


def legend(color: bool = True) -> Text:
    """'weight 0 ▕colours▏ 1   ◆ strongest target of the head'."""
    text = Text("weight 0 ")
    for w in np.linspace(0, 1, 11):
        text.append("  " if color else shade(float(w)) * 2, style=Style(bgcolor=colour(float(w))) if color else "")
    text.append(" 1    ")
    text.append(MARK, style="bold")
    text.append(" strongest target of each head")
    return text


def summary(att: Attention, query: int) -> Text:
    """The strongest link from ``query`` to another (non-special) token over all shown
    heads; when that is a neighbour (positional heads are common), also the strongest
    link that reaches further."""
    rows = att.rows(query).copy()  # (N, H, S)
    rows[:, :, np.array(att.keys.special)] = -1.0
    if not att.is_self_attention:
        # Cross-attention: the keys are the source, so there is no self or neighbour.
        n, h, s = np.unravel_index(int(np.argmax(rows)), rows.shape)
        text = Text()
        if rows[n, h, s] >= 0:
            text.append("strongest link to a source word: ")
            text.append(f"layer {att.layers[n]} head {h}", style="bold")
            text.append(f"  {att.tokens.labels[query]!r} → {att.keys.labels[s]!r}  {rows[n, h, s]:.2f}")
        return text
    rows[:, :, query] = -1.0
    text = Text()
    for lead, exclude in (("strongest link to another word", ()), ("beyond the neighbours", (query - 1, query + 1))):
        candidates = rows.copy()
        for i in exclude:
            if 0 <= i < candidates.shape[-1]:
                candidates[:, :, i] = -1.0
        n, h, s = np.unravel_index(int(np.argmax(candidates)), candidates.shape)
        if candidates[n, h, s] < 0:
            break
        text.append(f"{lead}: " if not exclude else f"\n{lead}: ")
        text.append(f"layer {att.layers[n]} head {h}", style="bold")
        text.append(f"  {att.tokens.labels[query]!r} → {att.tokens.labels[s]!r}  {candidates[n, h, s]:.2f}")
        if abs(int(s) - query) > 1:
            break  # the strongest link already reaches past the neighbours
    return text


def render_show(att: Attention, queries: tuple[int, ...], console: Console, *, values: bool = False) -> None:
    """Print every kept layer's heatmap for each query token, then a legend and summary."""
    # rich keeps a colour system under NO_COLOR but drops background colours, which
    # would leave blank cells: use the glyph fallback instead.
    color = console.color_system is not None and not console.no_color
    p = att.provenance
    header = Text(f"{p.model} · engine {p.engine} · {p.device} · {p.num_layers} layers × {p.num_heads} heads")
    console.print(header, style="dim")
    if att.part is not None:
        console.print(Text(part_note(att), style="dim"))
    if att.keys.pair_start is not None:
        console.print(Text(pair_note(att), style="dim"))
    if p.score_terms:
        console.print(Text(score_note(p.score_terms), style="dim"))
    for note in p.shape.notes():
        console.print(Text(note, style="dim"))
    if len(queries) > 1:
        pieces = " + ".join(repr(att.tokens.labels[q]) for q in queries)
        console.print(Text(f"the word is split into {len(queries)} tokens ({pieces}); each is shown", style="dim"))
    for q in queries:
        for layer in att.layers:
            console.print(token_heatmap(att, q, layer, values=values, color=color, width=console.width))
    console.print(legend(color))
    for q in queries:
        console.print(summary(att, q))
