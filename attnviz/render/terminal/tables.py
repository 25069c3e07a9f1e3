"""Terminal tables of per-head metrics: ``attnviz.measures.metrics.HeadStats`` and ``PairStats``
rows in, rich renderables out (``render_compare`` is compare's counterpart of
``render_show``). No model, no torch.

Colour is optional (``color=False`` on a pipe or under NO_COLOR): weights then print as
plain numbers and a change keeps its sign, so nothing is carried by colour alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...measures.metrics import HeadStats, PairStats
from ...result import Attention
from ...shape import head_label
from . import part_note, provenance_line, weight_style, written_note


def _num(value: float | None, digits: int = 2) -> str:
    # None: a statistic that does not apply (positional shares of cross-attention).
    return "–" if value is None else f"{value:.{digits}f}"


def _effect(value: float | None) -> str:
    """1 − cos: small numbers, three digits (– for an aggregate slot or a head not done)."""
    return "–" if value is None or value != value else f"{value:.3f}"


def _weight(value: float, *, color: bool, bold: bool = False) -> Text:
    """A weight in 0..1, on the heatmap's viridis ramp when colour is on."""
    if not color:
        return Text(_num(value), style="bold" if bold else "")
    return Text(_num(value), style=weight_style(value, bold=bold))


def _delta(value: float, *, color: bool) -> Text:
    if abs(value) < 0.005:
        return Text("0.00")  # not "-0.00": a sign on a change that rounds away misleads
    text = f"{value:+.2f}"
    if not color:
        return Text(text)
    return Text(text, style="green" if value > 0 else "red")


def _top(stats: HeadStats, stacked: bool = False) -> str:
    # Stacked (one entry per line) when the line would not fit: rich wraps at any space,
    # and would split a token from its weight.
    return ("\n" if stacked else "  ").join(f"{label} {weight:.2f}" for label, weight in stats.top)


def _stack(columns: Sequence[Sequence[HeadStats]], fixed: int, width: int | None, widest_entry: bool = False) -> bool:
    """Whether the top-k ``columns`` overflow ``width`` beside ``fixed`` columns: as one
    line each, or (``widest_entry``) even with one entry per line."""
    if width is None or not columns or not columns[0]:
        return False
    needed = 0
    for column in columns:
        cells = [_top(stats, stacked=widest_entry) for stats in column]
        needed += max(len(line) for cell in cells for line in cell.split("\n")) + 1
    return fixed + needed > width


def _table() -> Table:
    # collapse_padding: one space between columns, so the numbers fit beside the top-k
    # list on an 80-column terminal.
    return Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")


def _titled(title: str | None, table: Table, note: str | None = None) -> RenderableType:
    # Title and note on their own lines: as a Table title/caption they would wrap at the
    # table's width.
    parts: list[RenderableType] = [] if title is None else [Text(title, style="italic")]
    parts.append(table)
    if note:
        parts.append(Text(note, style="dim"))
    return parts[0] if len(parts) == 1 else Group(*parts)


def _head(head: int, num_heads: int | None, num_kv_heads: int | None) -> str:
    if num_heads and num_kv_heads:
        return head_label(head, num_heads, num_kv_heads)
    return str(head)


def head_rows_table(
    rows: Sequence[HeadStats],
    *,
    sort_by: str | None = None,
    title: str | None = None,
    color: bool = True,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    width: int | None = None,
) -> RenderableType:
    """One line per head: top targets, each target word's weight, entropy and shares.

    ``sort_by`` names the column the rows are ordered by; its header is marked ▼/▲.
    ``width``: the terminal's; when the top-k list does not fit on one line beside the
    numbers, its entries go one per line.
    """
    targets = list(rows[0].targets) if rows else []
    k = len(rows[0].top) if rows else 0
    top_name = f"top {k}" if k > 1 else "top"
    marks = {
        "weight": targets[0] if targets else top_name,
        "entropy": "entropy",
        "sink": "sink",
        "distance": "dist",
        "effect": "effect",
    }
    marked = marks.get(sort_by or "")

    def header(name: str, ascending: bool = False) -> str:
        return name + (" ▲" if ascending else " ▼") if name == marked else name

    # Models with learned sink logits (GPT-OSS): the share of each row that no token got.
    logit_sink = any(row.sink_logit is not None for row in rows)
    # Head ablation (--ablate): 1 − cos, and with an LM head its KL and Δ log p.
    ablated = any(row.effect is not None for row in rows)
    lm = any(row.kl is not None for row in rows)
    # layer, head, targets, entropy ▲, four shares, dist (, logit sink): each plus one space.
    fixed = 6 + 5 + sum(max(len(w) + 2, 5) for w in targets) + 10 + 4 * 5 + 6 + (11 if logit_sink else 0)
    fixed += (9 if ablated else 0) + (15 if lm else 0)
    stacked = _stack([rows], fixed, width)
    table = _table()
    table.add_column("layer", justify="right", no_wrap=True)
    table.add_column("head", justify="right", no_wrap=True)
    table.add_column(header(top_name), no_wrap=True)
    for word in targets:
        table.add_column(header(word), justify="right", no_wrap=True)
    table.add_column(header("entropy", ascending=True), justify="right", no_wrap=True)
    for name in ("sink", "self", "prev", "next"):
        table.add_column(header(name), justify="right", no_wrap=True)
    table.add_column(header("dist"), justify="right", no_wrap=True)
    if logit_sink:
        table.add_column("logit sink", justify="right", no_wrap=True)
    if ablated:
        table.add_column(header("effect"), justify="right", no_wrap=True)
    if lm:
        table.add_column("kl", justify="right", no_wrap=True)
        table.add_column("Δlogp", justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            str(row.layer),
            row.name or _head(row.head, num_heads, num_kv_heads),
            _top(row, stacked=stacked),
            *(_weight(row.targets[w], color=color, bold=w == marked) for w in targets),
            _num(row.entropy),
            *(_num(share) for share in (row.sink, row.self_share, row.prev, row.next)),
            _num(row.distance, 1),
            *([_num(row.sink_logit) if row.sink_logit is not None else "-"] if logit_sink else []),
            *([_effect(row.effect)] if ablated else []),
            *([_num(row.kl, 3), _num(row.delta_logprob, 3)] if lm else []),
        )
    return _titled(title, table)


def pair_rows_table(
    rows: Sequence[PairStats],
    *,
    title: str | None = None,
    color: bool = True,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    width: int | None = None,
    names: dict[str, str] | None = None,
) -> RenderableType:
    """One line per head of a minimal pair: each target's weight in A and B, the change
    B - A, and where the token looks in each sentence (stacked when ``width`` is short).
    ``names``: each target's header, as the sentence spells it (the file may say "anna").

    Too narrow for the top lists beside the changes even stacked: they follow in a table
    of their own, the same heads in the same order, so nothing is left out."""
    targets = list(rows[0].a.targets) if rows else []
    names = names or {}
    fixed = 6 + 5 + sum(2 * max(len(names.get(w, w)) + 3, 5) + 6 for w in targets)
    columns = [[row.a for row in rows], [row.b for row in rows]]
    stacked = _stack(columns, fixed, width)
    beside = not (stacked and _stack(columns, fixed, width, widest_entry=True))
    table = _table()
    table.add_column("layer", justify="right", no_wrap=True)
    table.add_column("head", justify="right", no_wrap=True)
    for word in targets:
        table.add_column(f"{names.get(word, word)} A", justify="right", no_wrap=True)
        table.add_column(f"{names.get(word, word)} B", justify="right", no_wrap=True)
        table.add_column("Δ", justify="right", no_wrap=True)
    tops = table if beside else _table()
    if not beside:
        tops.add_column("layer", justify="right", no_wrap=True)
        tops.add_column("head", justify="right", no_wrap=True)
        stacked = _stack(columns, 6 + 5, width)
    tops.add_column("top A", no_wrap=True)
    tops.add_column("top B", no_wrap=True)
    for row in rows:
        head = [str(row.layer), row.a.name or _head(row.head, num_heads, num_kv_heads)]
        cells: list[Any] = list(head)
        delta = row.delta
        for word in targets:
            cells += [
                _weight(row.a.targets[word], color=color),
                _weight(row.b.targets[word], color=color),
                _delta(delta[word], color=color),
            ]
        top = [_top(row.a, stacked=stacked), _top(row.b, stacked=stacked)]
        if beside:
            table.add_row(*cells, *top)
        else:
            table.add_row(*cells)
            tops.add_row(*head, *top)
    if beside:
        return _titled(title, table)
    return Group(
        _titled(title, table),
        Text("top targets in sentence A and B, the same heads in the same order:", style="italic"),
        tops,
    )


def as_written(text: str, word: str) -> str:
    """``word`` (a target as given, ``WORD`` or ``WORD:N``) spelled as ``text`` spells it:
    targets are found whatever their case, and a header says the sentence's word."""
    import re

    base, sep, n = word.partition(":")
    found = re.search(rf"(?<!\w){re.escape(base)}(?!\w)", text, flags=re.IGNORECASE)
    return (found.group(0) if found else base) + sep + n


def render_compare(
    att: Attention,
    queries: Sequence[int],
    rows: Sequence[HeadStats] | Sequence[PairStats],
    sort: str,
    *,
    width: int,
    color: bool,
    header: bool = True,
    exclude: Sequence[str] = (),
) -> Group:
    """compare's answer, to print: a provenance line (``header``), the reading steps, a
    note for a split word, and the head table (``PairStats`` rows: the minimal-pair table).
    ``exclude``: the kinds of target left out of the top list, said in the title.
    ``width``/``color``: ``terminal.for_console(console)``."""
    p = att.provenance
    parts: list[RenderableType] = []
    if header:
        parts.append(Text(provenance_line(p), style="dim"))
        parts += [Text(step, style="dim") for step in att.steps]
    if header and att.part is not None:
        parts.append(Text(part_note(att), style="dim"))
    if header and (written := written_note(att)) is not None:
        parts.append(Text(written, style="dim"))
    slot = att.query_slot(queries[0])
    span = att.query_span(slot)
    word = " ".join(att.tokens.labels[q] for q in span)
    pieces = att.pieces_of_query(slot)
    if len(pieces) > 1 and header:
        parts.append(Text(f"{word!r} covers {len(pieces)} tokens: its row is their mean", style="dim"))
    shown = f"{len(rows)} heads" if len(rows) < len(att.layers) * att.num_heads else "every head"
    kv = {"num_heads": p.num_heads, "num_kv_heads": p.num_kv_heads, "width": width}
    left_out = {"special": "special tokens", "punct": "punctuation", "adjacent": "neighbours"}
    kinds = [left_out[k] for k in ("special", "punct", "adjacent") if k in exclude]
    if kinds and header:
        parts.append(
            Text(
                f"top lists leave out {', '.join(kinds[:-1]) + ' and ' if len(kinds) > 1 else ''}{kinds[-1]}",
                style="dim",
            )
        )
    note = "" if att.measure == "weight" else " · measure: norm shares ‖α·f(x)‖ / row sum"
    kind = "word" if att.key_pieces is not None else "token"
    if rows and isinstance(rows[0], PairStats):
        what = "weight" if att.measure == "weight" else "norm share"
        title = f"{word!r}: {what} on each target in sentence A and B, Δ = B − A, {shown}, largest change first"
        if sort != "delta":
            title = title.rsplit(",", 1)[0] + f", sorted by {sort}"
        names = {w: as_written(att.tokens.text, w) for w in rows[0].a.targets} if rows else {}
        parts.append(pair_rows_table(rows, title=title + note, color=color, names=names, **kv))  # type: ignore[arg-type]
        return Group(*parts)
    if att.part == "cross" and kind == "token":
        kind = "source token"
    title = f"{word!r} → each {kind}, {shown}, sorted by {sort}{note}"
    parts.append(head_rows_table(rows, sort_by=sort, title=title, color=color, **kv))  # type: ignore[arg-type]
    return Group(*parts)
