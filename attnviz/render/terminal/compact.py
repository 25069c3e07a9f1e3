"""The compact terminal view of one token's attention in a long text: one line per head.

When a row of the grid (``terminal.token_heatmap``) would wrap into more than two blocks,
``show`` prints this instead: for each head its strongest k keys (label, position,
weight) and a strip of the whole row across the rest of the terminal, each cell the
*summed* weight of a block of neighbouring keys. The query and the special tokens keep
bins of their own (a BOS sink or the query's own weight is never smeared into its
neighbours); special tokens are dimmed, the query is marked on the axis line above.
A layer takes H + 4 lines at any length and width (title, axis, heads, blank).

The binning is pure numpy (``key_bins``, ``binned``) so tests can hold the strip to the
JSON rows: the bins partition the kept keys, and their sums add up to the row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from rich.console import Group, RenderableType
from rich.style import Style
from rich.text import Text

from ...result import Attention
from .glyphs import MASKED, colours, shade

# The grid gives way to this view past two wrapped blocks (issue 22).
MAX_GRID_BLOCKS = 2
# A top key: "label@pos .wt"; labels cut to this many characters.
_TOP_LABEL = 8
_MIN_STRIP = 16
QUERY_MARK = "▼"


def key_bins(columns: int, cells: int, own: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Split key columns 0..columns-1 into at most ``cells`` contiguous bins [start, end).

    Every column in ``own`` (the query, special tokens) gets a bin of its own; the runs
    between them share the other cells in proportion to their length (at least one
    each), each run cut into near-equal blocks. With ``columns <= cells`` every column
    is its own bin. The bins cover 0..columns-1 once, in order.
    """
    if columns <= 0:
        return []
    if columns <= cells:
        return [(i, i + 1) for i in range(columns)]
    singles = sorted({int(i) for i in own if 0 <= int(i) < columns})
    # Too many singles would leave the rest no room: keep those that fit in a quarter.
    if len(singles) > cells // 4:
        singles = singles[: cells // 4]
    runs: list[tuple[int, int]] = []
    start = 0
    for s in singles:
        if s > start:
            runs.append((start, s))
        start = s + 1
    if start < columns:
        runs.append((start, columns))
    room = max(cells - len(singles), len(runs))
    total = sum(b - a for a, b in runs)
    share = [max(1, min(b - a, int(room * (b - a) / total))) if total else 0 for a, b in runs]
    # Hand out the cells rounding left, longest runs first.
    spare = room - sum(share)
    for k in sorted(range(len(runs)), key=lambda k: -(runs[k][1] - runs[k][0])):
        if spare <= 0:
            break
        add = min(spare, runs[k][1] - runs[k][0] - share[k])
        share[k] += add
        spare -= add
    bins: list[tuple[int, int]] = [(s, s + 1) for s in singles]
    for (a, b), n in zip(runs, share):
        edges = np.linspace(a, b, n + 1).round().astype(int)
        bins.extend((int(x), int(y)) for x, y in zip(edges[:-1], edges[1:]) if y > x)
    return sorted(bins)


def binned(rows: np.ndarray, bins: Sequence[tuple[int, int]]) -> np.ndarray:
    """(..., B) the summed weight of each bin of ``rows`` (..., S): one row, or every
    head's at once (float64)."""
    rows = np.asarray(rows, dtype=np.float64)
    if not len(bins):
        return np.zeros((*rows.shape[:-1], 0))
    # The bins are contiguous and in order (key_bins): one reduceat, not a loop per bin.
    if all(b[1] == c[0] for b, c in zip(bins, bins[1:])):
        return np.add.reduceat(rows[..., bins[0][0] : bins[-1][1]], [a - bins[0][0] for a, _ in bins], axis=-1)
    return np.stack([rows[..., a:b].sum(axis=-1) for a, b in bins], axis=-1)


def strip_bins(att: Attention, query: int, cells: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The kept key positions (those not set aside) and their bins for ``cells`` cells
    (bins index into the kept positions)."""
    n = len(att.keys)
    kept = np.ones(n, dtype=bool)
    kept[np.asarray(att.hidden, dtype=np.int64)] = False
    index = np.cumsum(kept) - 1  # (S,) each key's place among the kept ones (where kept)
    span = att.query_span(att.query_slot(query)) if att.is_self_attention else ()
    own = [i for i in span if kept[i]]
    # Causal rows end at the query: the first masked key starts a bin of its own.
    if att.provenance.causal and span and max(span) + 1 < n and kept[max(span) + 1]:
        own.append(max(span) + 1)
    special = np.flatnonzero(np.asarray(att.keys.special, dtype=bool) & kept)
    cols = np.flatnonzero(kept).tolist()
    return cols, key_bins(len(cols), cells, index[np.union1d(own, special).astype(np.int64)].tolist())


def grid_blocks(att: Attention, width: int, values: bool = False) -> int:
    """How many wrapped blocks the grid would need at ``width`` columns (the token
    columns at their cut width, beside a gutter of head names and strongest keys)."""
    hidden = set(att.hidden)
    cell_w = 5 if values else 3
    used = [max(cell_w, min(len(lab), 8)) + 1 for i, lab in enumerate(att.keys.labels) if i not in hidden]
    room = max(width - 30, 20)
    blocks, line = 1, 0
    for w in used:
        if line and line + w > room:
            blocks, line = blocks + 1, 0
        line += w
    return blocks


def default_top_keys(width: int) -> int:
    """How many strongest keys fit beside a useful strip: 2 at 80 columns, 3 from 100."""
    return max(1, min(3, (width - 40) // 18))


def _cut(label: str, width: int) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


@dataclass(frozen=True)
class HeadLine:
    """One head's compact line as data: the line's own style and its runs of text, each
    with the style of a span over it ("": none). ``text()`` is the rich ``Text`` that
    ``show`` prints; the explorer turns the runs into segments itself (tui.long): at 8,192
    tokens a layer's lines are ~6 ms of CPU that way, ~16 ms through rich's layout."""

    style: str
    runs: tuple[tuple[str, Style | str], ...]

    def text(self) -> Text:
        line = Text(style=self.style)
        for run, style in self.runs:
            line.append(run, style=style)
        return line


@dataclass(frozen=True)
class CompactLayer:
    """One layer of the compact view: the title and axis lines, one ``HeadLine`` per head
    slot, then a blank line (``renderable()``: what ``show`` prints)."""

    title: Text
    axis: Text
    heads: tuple[HeadLine, ...]

    def renderable(self) -> RenderableType:
        return Group(self.title, self.axis, *(line.text() for line in self.heads), Text(""))


def compact_layer(
    att: Attention,
    query: int,
    layer: int,
    *,
    width: int = 120,
    top_keys: int | None = None,
    color: bool = True,
    heads: Sequence[int] | None = None,
    effects: np.ndarray | None = None,
) -> CompactLayer:
    """One layer, one line per head slot: the ``top_keys`` strongest keys and the binned
    strip of the whole row, as data; ``.renderable()`` is what ``show`` prints: H + 4 lines
    (title, axis, one per head, a blank).

    ``effects``: (N_model, H) head-ablation effects at this query (``show --ablate``): each
    model head's, after its name (– for a head not ablated)."""
    k_top = default_top_keys(width) if top_keys is None else top_keys
    slot = att.query_slot(query)
    span = att.query_span(slot)
    slots = [*(range(att.model_heads) if heads is None else heads), *range(att.model_heads, att.num_heads)]
    labels = att.keys.labels
    causal = att.provenance.causal
    names = [att.head_name(h) for h in slots]
    name_w = max(len(n) for n in names) + 1
    eff_w = EFFECT_W if effects is not None else 0
    pos_w = len(str(len(labels) - 1))
    one_w = _TOP_LABEL + 1 + pos_w + 4  # "label@pos .wt"
    top_w = k_top * (one_w + 1)
    cells = max(width - name_w - eff_w - top_w - 3, _MIN_STRIP)
    cols, bins = strip_bins(att, query, cells)
    kind = "word" if att.key_pieces is not None else "token"
    who = " ".join(att.tokens.labels[i] for i in span)
    where = f"{kind} {span[0]}" if len(span) == 1 else f"{kind}s {span[0]}-{span[-1]}, averaged"
    per = (len(cols) + len(bins) - 1) // max(len(bins), 1)
    title = Text(
        f"layer {layer} · {who!r} ({where}) → {len(cols)} {kind}s · strongest {k_top} (label@position weight)"
        f" · strip: {len(bins)} cells, each the summed weight of ≤{per} {kind}s"
    )
    if causal:
        title.append(f" · later {kind}s ({MASKED}) masked")
    if effects is not None:
        title.append(" · after each head: its ablation effect (1 − cos of the final hidden state)")
    # The axis: first and last position, and the query under its mark.
    axis = [" "] * len(bins)
    cols_arr, starts = np.asarray(cols), np.asarray([a for a, _ in bins])
    at = np.searchsorted(cols_arr, span)  # where the query's own positions sit among the kept keys
    shown = [int(j) for j, p in zip(at, span) if j < len(cols_arr) and cols_arr[j] == p]
    qbin = int(np.searchsorted(starts, min(shown), side="right")) - 1 if shown else None
    if qbin is not None and att.is_self_attention:
        axis[qbin] = QUERY_MARK
    first, last = str(cols[0]), str(cols[-1])
    if len(bins) > len(first) + len(last) + 2:
        for j, ch in enumerate(first):
            if axis[j] == " ":
                axis[j] = ch
        for j, ch in enumerate(last):
            if axis[len(bins) - len(last) + j] == " ":
                axis[len(bins) - len(last) + j] = ch
    axis_line = Text(" " * (name_w + eff_w + top_w + 2) + "".join(axis), style="dim")

    # Every head at once: the kept keys of each row, their bins' sums and the strongest keys.
    kept = att.rows(query)[att.layer_slot(layer)][np.asarray(slots)][:, cols_arr]  # (H', S')
    sums = binned(kept, bins)  # (H', B)
    tops = strongest(kept, k_top)  # (H', ≤k) indices into cols, strongest first
    # What a bin is, the same for every head: masked (after a causal query) or all special.
    special = np.asarray(att.keys.special, dtype=bool)[cols_arr]
    masked = (cols_arr[starts] > max(span)) if causal and span else np.zeros(len(bins), dtype=bool)
    dim = np.logical_and.reduceat(special, starts) if len(bins) else np.zeros(0, dtype=bool)
    hexes = colours(sums) if color else None
    lines = []
    for n, (name, h) in enumerate(zip(names, slots)):
        runs: list[tuple[str, Style | str]] = [(name.rjust(name_w - 1) + " ", "")]
        if effects is not None:
            runs.append((_effect_cell(effects, layer, h, att.model_heads), "bold"))
        top = []
        for j in tops[n]:
            i, w = int(cols_arr[j]), kept[n, j]
            weight = f"{w:.2f}".lstrip("0") if w < 1 else "1.0"
            top.append(f"{_cut(labels[i], _TOP_LABEL)}@{i} {weight}".ljust(one_w))
        runs.append((" ".join(top).ljust(top_w) + " │", ""))
        for b, total in enumerate(sums[n]):
            if masked[b]:
                runs.append((MASKED, "dim"))
            elif hexes is not None:
                runs.append(("·" if dim[b] else " ", _cell_style(hexes[n][b], bool(dim[b]), b == qbin)))
            else:
                glyph = shade(float(total)) if not dim[b] or total >= 0.05 else "·"
                runs.append((glyph, "dim" if dim[b] else ""))
        runs.append(("│", ""))
        lines.append(HeadLine("dim" if h < att.model_heads else "dim italic", tuple(runs)))
    return CompactLayer(title, axis_line, tuple(lines))


def strongest(rows: np.ndarray, k: int) -> np.ndarray:
    """(R, min(k, S)) the columns of each row's ``k`` largest values, largest first, ties
    to the lower column (a stable sort's order): k rounds of argmax, which returns the first
    of equal maxima, each taken out before the next (k is a few; a sort is O(S log S) a row)."""
    k = min(k, rows.shape[1])
    left = np.array(rows, dtype=np.float64)  # a copy, taken apart below
    out = np.empty((len(rows), max(k, 0)), dtype=np.int64)
    every = np.arange(len(rows))
    for t in range(k):
        out[:, t] = np.argmax(left, axis=1)
        left[every, out[:, t]] = -np.inf
    return out


EFFECT_W = 6  # "0.105 ": an effect and a space


@lru_cache(maxsize=4096)
def _cell_style(hex_colour: str, dim: bool, underline: bool) -> Style:
    """A strip cell's style, made once for each (colour, dim, underline): a layer has
    ~1,700 cells at 120 columns and far fewer colours (Styles are immutable, so shared)."""
    return Style(bgcolor=hex_colour, dim=dim, underline=underline)


def _effect_cell(effects: np.ndarray, layer: int, head: int, model_heads: int) -> str:
    """A head's effect in EFFECT_W characters; blank for an aggregate slot, – for NaN."""
    if head >= model_heads:
        return " " * EFFECT_W
    value = float(effects[layer, head])
    return ("–" if math.isnan(value) else f"{value:.3f}").rjust(EFFECT_W - 1) + " "


def full_grid_lines(att: Attention, queries: Sequence[int], width: int, values: bool, heads: int) -> int:
    """About how many lines the full grids would take (``--full``): per query and layer,
    one block of head lines plus a header per wrap, a title and a blank."""
    blocks = grid_blocks(att, width, values)
    return len(queries) * len(att.layers) * (blocks * (heads + 1) + 2)
