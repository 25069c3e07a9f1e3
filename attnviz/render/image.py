"""Image views built with matplotlib: per-head heatmaps as PNG, SVG or PDF.

Renderers take data (an ``Attention``), never models. Each view is a pure function
returning a matplotlib ``Figure`` built with the object API on an Agg canvas: no
pyplot, so no global state, no GUI backend, and tests can read the drawn data back
from ``ax.images[0].get_array()``.

This module imports matplotlib at import time; only code that writes an image
imports it (``attnviz --help`` must not pay for matplotlib).

Layout is computed by hand, in inches, from the number of heads and tokens: no
``tight_layout``/constrained layout (slow, and their result depends on the
renderer), and the saved pixel size is exactly ``figsize × dpi``.

Shape legend: N layers, H heads, Q query positions, S tokens.
"""

from __future__ import annotations

import dataclasses
import io
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.patches import Rectangle

from ..errors import UsageError
from ..result import Attention, atomic_write, check_writable
from . import COLUMN_IN, DEFAULT_DPI, DEFAULT_FONT_PT, IMAGE_FORMATS, FigureStyle

MASKED = "#d0d0d0"  # light grey: not on the viridis ramp, so a masked cell never reads as a weight

# Sizes in inches / points, for tick labels of ``pt`` points (FigureStyle.fontsize). Cells
# shrink for long sentences down to _MIN_CELL; labels then thin out instead of overlapping.
_MAX_LABEL = 14  # characters; longer token labels are cut with "…"
_MAX_GRID_W = 15.0  # the panels' total width never exceeds this
_MIN_CELL = 0.03
_MIN_MATRIX_CELL = 0.01  # the matrix view's cells may be smaller: a matrix reads as a texture
_MIN_FIXED_CELL = 0.005  # with a fixed figure size (style.figsize), cells may shrink this far
_COLORBAR_IN = 0.14
# The largest image drawn: 100 million pixels, a 400 MB RGBA buffer (an unbounded --dpi
# on a 500-token matrix asked matplotlib for 11 GB).
MAX_PIXELS = 100_000_000


def _line_in(pt: float) -> float:
    """Height of one line of ``pt``-point text, in inches."""
    return pt * 1.25 / 72


def _char_in(pt: float) -> float:
    """A generous average glyph width of ``pt``-point DejaVu Sans, in inches."""
    return pt * 0.62 / 72


@dataclass(frozen=True)
class _Grid:
    """Where the panels go, in inches, for a figure ``width`` × ``height``."""

    nrows: int
    ncols: int
    panel_w: float
    panel_h: float
    left: float
    bottom: float
    hgap: float
    vgap: float
    width: float
    height: float
    cell_w: float
    cell_h: float

    def rect(self, i: int) -> tuple[float, float, float, float]:
        """Figure-fraction [left, bottom, width, height] of panel ``i`` (row-major)."""
        r, c = divmod(i, self.ncols)
        x = self.left + c * (self.panel_w + self.hgap)
        y = self.bottom + (self.nrows - 1 - r) * (self.panel_h + self.vgap)
        return (x / self.width, y / self.height, self.panel_w / self.width, self.panel_h / self.height)

    @property
    def grid_w(self) -> float:
        return self.ncols * self.panel_w + (self.ncols - 1) * self.hgap

    @property
    def grid_h(self) -> float:
        return self.nrows * self.panel_h + (self.nrows - 1) * self.vgap


# Models with learned sink logits (GPT-OSS): no row of their weights sums to 1.
_SINK_NOTE = "learned sinks: rows sum to 1 - the logit sink"


def _slots(att: Attention, style: FigureStyle) -> list[int]:
    """Head-axis slots to draw: the chosen model heads (all by default), then every aggregate."""
    if style.heads is None:
        heads = list(range(att.model_heads))
    else:
        bad = [h for h in style.heads if not 0 <= h < att.model_heads]
        if bad:
            raise UsageError(
                f"head {bad[0]} is out of range: the model has {att.model_heads} heads (0..{att.model_heads - 1})",
                hint=f"pick heads 0..{att.model_heads - 1}",
            )
        heads = list(dict.fromkeys(style.heads))
    return heads + list(range(att.model_heads, att.num_heads))


def _columns(att: Attention) -> list[int]:
    """Token columns to draw: every token except those set aside (``att.hidden``)."""
    hidden = set(att.hidden)
    return [i for i in range(len(att.keys)) if i not in hidden]


def _vmax(style: FigureStyle, arrays: Sequence[np.ndarray]) -> float:
    if style.vmax != "auto":
        return float(style.vmax)
    top = max((float(np.ma.max(a)) for a in arrays if np.ma.count(a)), default=1.0)
    return top if top > 0 else 1.0


_PART_NAMES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention: decoder (rows) → source (columns)",
}


def _key_noun(att: Attention) -> str:
    if att.key_pieces:
        return "word"
    return "source token" if att.part == "cross" else "token"


def _texts(att: Attention) -> str:
    """The text(s) the figure is about: for cross-attention, target and source."""
    if att.key_tokens is None:
        return att.tokens.text
    return f"{att.tokens.text}  ←  {att.keys.text}"


def _pair_rules(ax: Axes, att: Attention, cols: Sequence[int], rows: bool) -> None:
    """A sentence pair: a white rule before sentence B's first key column (and, with
    ``rows``, before its first query row)."""
    start = att.keys.pair_start
    if start is None or att.key_pieces is not None:
        return  # one sentence, or words merged (the columns are no longer tokens)
    after = [n for n, c in enumerate(cols) if c >= start]
    if after and after[0] > 0:
        ax.axvline(after[0] - 0.5, color="white", linewidth=1.2)
    if rows and att.is_self_attention:
        below = [n for n, q in enumerate(att.queries) if q >= start]
        if below and below[0] > 0:
            ax.axhline(below[0] - 0.5, color="white", linewidth=1.2)


def _steps_text(att: Attention) -> str:
    tags = [step.split(":", 1)[0] for step in att.steps]
    return " · " + "; ".join(tags) if tags else ""


def token_figure(
    att: Attention, query: int, layers: Sequence[int] | None = None, style: FigureStyle | None = None
) -> Figure:
    """One token's attention: per layer, a panel of heads (rows) × tokens (columns).

    With several layers the panels go on a grid with one shared colour scale (0..1 by
    default, the same in every layer and every figure; ``style.vmax`` changes the top)
    and one colour bar. Aggregate slots (head mean/max, rollout) are extra rows below a
    white rule. Tokens set aside (``att.hidden``) are not drawn. For causal models the
    tokens after ``query`` cannot be attended to and are drawn masked (grey).

    Raises:
        UsageError: ``query`` was not kept as a query row, a layer was not computed, a
            head is out of range, or the colormap is unknown.
    """
    style = style or FigureStyle()
    layers = tuple(att.layers if layers is None else layers)
    if not layers:
        raise UsageError("no layers to draw", hint="give at least one layer")
    slot = att.query_slot(query)
    rows = att.rows(query)  # (N, H, S)
    slots = _slots(att, style)
    cols = _columns(att)
    labels = [att.keys.labels[i] for i in cols]  # the columns: the source tokens, for cross-attention
    p = att.provenance
    n_rows, n_tok = len(slots), len(cols)
    pt = style.fontsize
    # Wide sentences get fewer columns so each panel keeps readable cells.
    ncols = min(len(layers), 3 if n_tok <= 20 else 2 if n_tok <= 40 else 1)
    nrows = math.ceil(len(layers) / ncols)
    head_names = [att.head_name(h) for h in slots]
    ylabel_w = _char_in(pt) * max(len(s) for s in head_names) + 0.12
    xlabel_h = _char_in(pt) * max(len(_short(s)) for s in labels) + 0.12
    span = att.query_span(slot)
    span_cols = [cols.index(i) for i in span if i in cols]  # the chosen token(s), as columns
    # Longer texts than the widest figure holds at the smallest cell: blocks of tokens, summed.
    across, _ = _capacity(nrows, ncols, square=False, ylabel_w=ylabel_w, xlabel_h=xlabel_h, hgap=0.12, style=style)
    block = math.ceil(n_tok / across)
    short = _block_labels(labels, block, span_cols)
    unit = "word" if att.key_pieces else "token"
    subtitle = (
        f"{p.model} · engine {p.engine} · {_layers_text(layers)} · "
        f"{' '.join(att.tokens.labels[i] for i in span)!r} → each {_key_noun(att)}, per head"
        + _steps_text(att)
        + (f" · {_PART_NAMES[att.part]}" if att.part is not None else "")
    )
    if p.attention_sinks and not att.hidden:
        # Before the longer notes: a subtitle is cut after two lines.
        subtitle = subtitle.replace(f"engine {p.engine} · ", f"engine {p.engine} · {_SINK_NOTE} · ", 1)
    if block > 1:
        subtitle += f" · binned: each cell sums the weights of {block} {unit}s ({n_tok} in all)"
    if p.causal:
        subtitle += " · causal: later tokens masked (grey)"
    # One layer fits a paper's text column unless a size is given.
    max_w = style.figsize[0] if style.figsize else COLUMN_IN if len(layers) == 1 else None
    grid, head, sub = _layout(
        nrows,
        ncols,
        n_x=len(short),
        n_y=n_rows,
        cell_h=0.16 * pt / DEFAULT_FONT_PT,
        ylabel_w=ylabel_w,
        xlabel_h=xlabel_h,
        hgap=0.12,
        sentence=_texts(att),
        subtitle=subtitle,
        style=style,
        max_w=max_w,
    )
    fig = _figure(grid)
    if style.title:
        _title(fig, grid, head, sub, pt)
    # (S'/block,): a block is masked only when every token in it is in the future.
    future = _bin_all((np.array(cols) > max(span))[None, :], 1, block)[0] if p.causal else None
    data = [_bin(rows[att.layer_slot(layer)][slots][:, cols], 1, block) for layer in layers]  # each (H', S'/block)
    shown = [d if future is None else np.ma.masked_array(d, np.broadcast_to(future, d.shape)) for d in data]
    vmax = _vmax(style, shown)
    # The query's own column(s) bold; cross-attention's keys are another text.
    bold = tuple(sorted({c // block for c in span_cols})) if att.is_self_attention else ()
    dim = tuple(_bin_all(np.array([att.keys.special[i] for i in cols])[None, :], 1, block)[0])  # all special
    image: AxesImage | None = None
    for i, (layer, d) in enumerate(zip(layers, data)):
        ax = fig.add_axes(grid.rect(i))
        image = _heatmap(ax, d, None if future is None else np.broadcast_to(future, d.shape), style, vmax)
        if att.aggregates and n_rows > len(att.aggregates):
            ax.axhline(n_rows - len(att.aggregates) - 0.5, color="white", linewidth=1.5)
        _pair_rules(ax, att, cols, rows=False)
        ax.set_title(f"layer {layer}", fontsize=pt, pad=3, loc="left")
        # Label each grid axis once: tokens under the bottom panel of each column, heads
        # left of the first column.
        bottom_of_column = i + ncols >= len(layers)
        _ticks(ax, "x", short, grid.cell_w, pt, show=bottom_of_column, bold=bold, dim=dim)
        _ticks(ax, "y", head_names, grid.cell_h, pt, show=i % ncols == 0)
    assert image is not None  # layers is not empty (checked above)
    _colorbar(fig, grid, image, pt)
    return fig


def matrix_figure(
    att: Attention, layer: int, highlight: Sequence[int] = (), style: FigureStyle | None = None
) -> Figure:
    """One layer's full query × key matrix for each head, as a grid of panels.

    Tokens are labelled on the outer axes only (keys under the bottom row, queries left
    of the first column). Rows in ``highlight`` (token positions) are outlined. For
    causal models the upper triangle (a query looking at later tokens) is masked.

    Raises:
        UsageError: ``layer`` was not computed, or a highlighted token is not a kept query.
    """
    style = style or FigureStyle()
    mats = att.matrix(layer)  # (H, Q, S)
    slots = _slots(att, style)
    cols = _columns(att)
    n_panels, n_q, n_tok = len(slots), mats.shape[1], len(cols)
    labels = att.keys.labels  # the columns: the source tokens, for cross-attention
    p = att.provenance
    pt = style.fontsize
    # A near-square grid of square panels; long sentences shrink the cells (and thin the
    # labels) rather than grow the page past _MAX_GRID_W in either direction.
    ncols = math.ceil(math.sqrt(n_panels))
    nrows = math.ceil(n_panels / ncols)
    texts = [labels[i] for i in cols] + [att.tokens.labels[q] for q in att.queries]  # keys, then queries
    label_in = _char_in(pt) * max(len(_short(t)) for t in texts) + 0.12
    # More tokens than the largest page holds at the smallest cell: blocks of keys (summed)
    # and of queries (averaged), so a cell is still a share of one query's attention. The
    # same block size both ways keeps the cells square and the diagonal a diagonal.
    across, down = _capacity(nrows, ncols, square=True, ylabel_w=label_in, xlabel_h=label_in, hgap=0.1, style=style)
    kb, qb = math.ceil(n_tok / min(across, down)), math.ceil(n_q / min(across, down))
    hl_slots = [att.query_slot(q) for q in highlight]  # raises for a highlight that is not a kept query
    short = _block_labels([labels[i] for i in cols], kb)
    q_short = _block_labels([att.tokens.labels[q] for q in att.queries], qb, hl_slots)
    sinks = f"{_SINK_NOTE} · " if p.attention_sinks and not att.hidden else ""
    subtitle = f"{p.model} · engine {p.engine} · {sinks}layer {layer} · each head: query (row) → key (column)"
    subtitle += _steps_text(att)
    if kb > 1 or qb > 1:
        subtitle += f" · binned: a cell sums {kb} keys' weights, averaged over {qb} queries ({n_q} × {n_tok} in all)"
    if att.part is not None:
        subtitle += f" · {_PART_NAMES[att.part]}"
    if p.causal:
        subtitle += " · causal: the masked (grey) upper triangle is future tokens"
    grid, head, sub = _layout(
        nrows,
        ncols,
        n_x=len(short),
        n_y=len(q_short),
        cell_h=None,
        ylabel_w=label_in,
        xlabel_h=label_in,
        hgap=0.1,
        sentence=_texts(att),
        subtitle=subtitle,
        style=style,
        max_w=style.figsize[0] if style.figsize else None,
    )
    fig = _figure(grid)
    if style.title:
        _title(fig, grid, head, sub, pt)
    # (Q, S'): True where query queries[q] may not see key cols[s]; binned, a cell is grey
    # only when every weight in it is masked.
    mask = np.array(cols)[None, :] > np.array(att.queries)[:, None] if p.causal else None
    if mask is not None:
        mask = _bin_all(mask, qb, kb)
    rows_hl = sorted({r // qb for r in hl_slots})
    data = [_bin(mats[h][:, cols], qb, kb) for h in slots]  # each (Q/qb, S'/kb)
    dim_k = tuple(_bin_all(np.array(att.keys.special)[cols][None, :], 1, kb)[0])
    dim_q = tuple(_bin_all(np.array(att.tokens.special)[list(att.queries)][None, :], 1, qb)[0])
    vmax = _vmax(style, [d if mask is None else np.ma.masked_array(d, mask) for d in data])
    image: AxesImage | None = None
    for i, (h, d) in enumerate(zip(slots, data)):
        ax = fig.add_axes(grid.rect(i))
        image = _heatmap(ax, d, mask, style, vmax)
        _pair_rules(ax, att, cols, rows=True)
        ax.set_title(att.head_name(h), fontsize=pt, pad=3, loc="left")
        for r in rows_hl:
            ax.add_patch(Rectangle((-0.5, r - 0.5), len(short), 1, fill=False, edgecolor="#ff3030", linewidth=1.0))
        _ticks(ax, "x", short, grid.cell_w, pt, show=i + ncols >= n_panels, dim=dim_k)
        _ticks(ax, "y", q_short, grid.cell_h, pt, show=i % ncols == 0, bold=tuple(rows_hl), dim=dim_q)
    assert image is not None  # a model has at least one head
    _colorbar(fig, grid, image, pt)
    return fig


# Fonts as fonts: TrueType (Type 42) in PDF and PostScript, which paper checkers accept
# (Type 3 is flagged), and text as <text> in SVG, editable and searchable. A fixed hash
# salt makes SVG ids, and so the whole file, the same on every run.
PAPER_RC: Any = {  # Any: matplotlib types rc keys as literals
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.fonttype": "none",
    "svg.hashsalt": "attnviz",
}


def check_pixels(fig: Figure, dpi: int) -> None:
    """Refuse a figure that at ``dpi`` would have more than MAX_PIXELS pixels.

    The Agg canvas allocates width × height × 4 bytes when it draws (for SVG and PDF too,
    for the panels' rasters), so this runs before anything is drawn.

    Raises:
        UsageError: over the budget; facts ``reason`` "pixels" and ``largest``, the
            largest dpi that fits.
    """
    width, height = fig.get_size_inches()
    pixels = (width * dpi) * (height * dpi)
    if pixels > MAX_PIXELS:
        largest = int(math.sqrt(MAX_PIXELS / (width * height)))
        raise UsageError(
            f"at {dpi} dpi the image would be {width * dpi:.0f} × {height * dpi:.0f} pixels "
            f"({pixels / 1e6:.0f} megapixels; the limit is {MAX_PIXELS / 1e6:.0f})",
            hint=f"use a dpi of at most {largest}",
            reason="pixels",
            largest=largest,
        )


def save_figure(fig: Figure, path: Path, dpi: int = DEFAULT_DPI) -> None:
    """Write ``fig`` to ``path`` in the format its extension names, atomically.

    Raises:
        OutputError: the extension is not .png/.svg/.pdf, or the file cannot be written.
        UsageError: the dpi is out of range, or the figure at that dpi has more than
            MAX_PIXELS pixels (``check_pixels``, before anything is drawn).
    """
    path = check_writable(Path(path), IMAGE_FORMATS)
    if not 10 <= dpi <= 2400:
        raise UsageError(f"dpi {dpi} is out of range", hint="use a dpi between 10 and 2400 (e.g. 150 or 300)")
    check_pixels(fig, dpi)
    fmt = path.suffix.lower().lstrip(".")
    # Rendered in memory first, so no temporary file exists while matplotlib works (a
    # signal during the render leaves nothing behind); metadata without dates keeps the
    # files reproducible.
    metadata = {"Software": None} if fmt == "png" else {"Date": None} if fmt == "svg" else {"CreationDate": None}
    from matplotlib import rc_context

    buffer = io.BytesIO()
    with rc_context(PAPER_RC):
        fig.savefig(buffer, format=fmt, dpi=dpi, metadata=metadata)
    atomic_write(path, buffer.getvalue())


# --- binning long inputs --------------------------------------------------------


def _bin(data: np.ndarray, row_block: int, col_block: int) -> np.ndarray:
    """(R, C) -> (⌈R/row_block⌉, ⌈C/col_block⌉): each block of columns (keys) summed,
    each block of rows (queries) averaged, so a cell stays a share of one query's
    attention (0..1) and a row of cells still sums to 1."""
    if row_block == col_block == 1:
        return data
    rows, cols = data.shape
    summed = np.add.reduceat(data, np.arange(0, cols, col_block), axis=1)  # (R, C')
    totals = np.add.reduceat(summed, np.arange(0, rows, row_block), axis=0)  # (R', C')
    counts = np.diff(np.r_[np.arange(0, rows, row_block), rows])  # rows in each block
    return (totals / counts[:, None]).astype(data.dtype, copy=False)


def _bin_all(flags: np.ndarray, row_block: int, col_block: int) -> np.ndarray:
    """(R, C) booleans -> True where every flag in the block is True."""
    if row_block == col_block == 1:
        return flags
    rows, cols = flags.shape
    by_cols = np.logical_and.reduceat(flags, np.arange(0, cols, col_block), axis=1)
    return np.logical_and.reduceat(by_cols, np.arange(0, rows, row_block), axis=0)


def _block_labels(labels: Sequence[str], block: int, keep: Sequence[int] = ()) -> list[str]:
    """One short label per block of ``block`` labels: its first, or the first of ``keep``
    (a chosen token's position) that falls in it, so the chosen token keeps its name."""
    shown = [_short(labels[i]) for i in range(0, len(labels), block)]
    for k in sorted(keep, reverse=True):
        shown[k // block] = _short(labels[k])
    return shown


def _capacity(
    nrows: int, ncols: int, *, square: bool, ylabel_w: float, xlabel_h: float, hgap: float, style: FigureStyle
) -> tuple[int, int]:
    """The most cells one panel can hold across and down at the smallest cell size.

    The room is what the largest figure leaves for panels: _MAX_GRID_W each way (a
    one-layer figure grows past the paper column before it bins), or exactly
    ``style.figsize`` less its margins (the title assumed at its longest, 2 + 3 lines).
    ``down`` is for square cells (the matrix view); the token view's head rows are not binned.
    """
    smallest = _smallest(style, square)
    room_w = room_h = _MAX_GRID_W
    if style.figsize:
        left, bottom, right, vgap = _margins(style.fontsize, ylabel_w, xlabel_h)
        room_w = style.figsize[0] - left - right - (ncols - 1) * hgap
        top = _top(style, 2, 3)
        room_h = style.figsize[1] - top - bottom - (nrows - 1) * vgap
    # A hair over the quotient, so that e.g. 15 / 0.02 is 750 cells, not 749.
    across = max(1, math.floor(room_w / (ncols * smallest) + 1e-9))
    down = max(1, math.floor(room_h / (nrows * smallest) + 1e-9))
    return across, down


# --- layout helpers -----------------------------------------------------------


def _short(label: str) -> str:
    return label if len(label) <= _MAX_LABEL else label[: _MAX_LABEL - 1] + "…"


def _layout(
    nrows: int,
    ncols: int,
    *,
    n_x: int,
    n_y: int,
    cell_h: float | None,
    ylabel_w: float,
    xlabel_h: float,
    hgap: float,
    sentence: str,
    subtitle: str,
    style: FigureStyle,
    max_w: float | None,
) -> tuple[_Grid, list[str], list[str]]:
    """Size the cells and place the panel grid inside margins for labels, title and bar.

    Each panel is ``n_x`` cells wide and ``n_y`` high. Cells are at most 0.26 in wide,
    narrower when the figure must fit ``max_w`` inches (or _MAX_GRID_W of panels);
    ``cell_h`` None makes them square. With ``style.figsize`` the figure is exactly
    that size and the cells fill it. Returns the grid and the title's sentence lines and
    subtitle lines, wrapped to the figure's width (the sentence to at most two lines).
    """
    pt = style.fontsize
    title_pt, sub_pt = pt * 1.25, pt * 0.95
    left, bottom, right, vgap = _margins(pt, ylabel_w, xlabel_h)
    side = left + right + (ncols - 1) * hgap
    room_w = (max_w - side) if max_w is not None else _MAX_GRID_W
    smallest = _smallest(style, cell_h is None)
    cell_w = max(smallest, min(0.26 if cell_h is not None else 0.16, room_w / max(n_x * ncols, 1)))
    if cell_h is None:  # square cells, and a square-ish page
        cell_w = min(cell_w, max(smallest, _MAX_GRID_W / max(n_y * nrows, 1)))
    # At least 6 in wide, for a readable title line (still inside a 6.3 in column).
    width = style.figsize[0] if style.figsize else max(left + ncols * n_x * cell_w + (ncols - 1) * hgap + right, 6.0)
    head = sub = []
    if style.title:
        head = textwrap.wrap(f"“{sentence.strip()}”", _fit(width, title_pt), max_lines=2, placeholder=" …”")
        sub = textwrap.wrap(subtitle, _fit(width, sub_pt), max_lines=3, placeholder=" …")
    top = _top(style, len(head), len(sub))
    h_cell = cell_w if cell_h is None else cell_h
    if style.figsize:
        room_h = style.figsize[1] - top - bottom - (nrows - 1) * vgap
        h_cell = max(0.005, room_h / max(n_y * nrows, 1))
        if cell_h is None:  # square cells, fitted both ways
            cell_w = h_cell = min(cell_w, h_cell)
    grid_h = nrows * n_y * h_cell + (nrows - 1) * vgap
    height = style.figsize[1] if style.figsize else bottom + grid_h + top
    grid = _Grid(nrows, ncols, n_x * cell_w, n_y * h_cell, left, bottom, hgap, vgap, width, height, cell_w, h_cell)
    # With a fixed size the grid sits under the title; what is left over is at the bottom.
    if style.figsize:
        grid = dataclasses.replace(grid, bottom=max(bottom, height - top - grid.grid_h))
    return grid, head, sub


def _margins(pt: float, ylabel_w: float, xlabel_h: float) -> tuple[float, float, float, float]:
    """(left, bottom, right, vgap) in inches around and between the panels."""
    left = ylabel_w + 0.1
    bottom = xlabel_h + 0.1
    right = 0.12 + _COLORBAR_IN + _char_in(pt) * 4 + _line_in(pt) + 0.1  # gap, bar, tick labels, caption
    vgap = _line_in(pt) + 0.1  # room for each panel's title
    return left, bottom, right, vgap


def _smallest(style: FigureStyle, square: bool) -> float:
    """The smallest cell, in inches: a fixed-size figure's, a matrix's, or a token row's."""
    return _MIN_FIXED_CELL if style.figsize else _MIN_MATRIX_CELL if square else _MIN_CELL


def _top(style: FigureStyle, head_lines: int, sub_lines: int) -> float:
    """Inches above the panels: the title's lines (when drawn) and the first panel title."""
    pt = style.fontsize
    top = 0.08
    if style.title:
        top = 0.12 + _lines_in(head_lines, pt * 1.25) + 0.06 + _lines_in(sub_lines, pt * 0.95)
    return top + _line_in(pt) + 0.1 + 0.02


def _fit(width: float, points: float) -> int:
    """How many characters of ``points``-size text fit in ``width`` inches (minus margins)."""
    return max(int((width - 0.2) / (points * 0.62 / 72)), 20)


def _lines_in(n: int, points: float) -> float:
    return n * points * 1.3 / 72


def _figure(grid: _Grid) -> Figure:
    fig = Figure(figsize=(grid.width, grid.height))
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: drawing works without pyplot
    return fig


def _title(fig: Figure, grid: _Grid, head: list[str], sub: list[str], pt: float) -> None:
    """The sentence, quoted, then a grey line of provenance, above the grid."""
    x = 0.1 / grid.width
    y = 1 - 0.12 / grid.height
    # parse_math=False: a "$" in a sentence or token is text, not the start of mathtext.
    fig.text(x, y, "\n".join(head), ha="left", va="top", fontsize=pt * 1.25, linespacing=1.2, parse_math=False)
    y -= (_lines_in(len(head), pt * 1.25) + 0.06) / grid.height
    fig.text(
        x, y, "\n".join(sub), ha="left", va="top", fontsize=pt * 0.95, color="0.3", linespacing=1.2, parse_math=False
    )


def _layers_text(layers: Sequence[int]) -> str:
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}–{layers[-1]}"
    return "layers " + ",".join(str(x) for x in layers)


def _heatmap(ax: Axes, data: np.ndarray, mask: np.ndarray | None, style: FigureStyle, vmax: float) -> AxesImage:
    """One panel: ``data`` (rows × columns) on the shared 0..vmax scale."""
    from matplotlib import colormaps

    try:
        cmap: Colormap = colormaps[style.cmap]
    except KeyError:
        raise UsageError(
            f"unknown colormap {style.cmap!r}", hint="use a matplotlib colormap, e.g. viridis, magma, Greys, Blues"
        ) from None
    shown: np.ndarray = data
    if mask is not None:
        shown = np.ma.masked_array(data, mask=mask)
        cmap = cmap.with_extremes(bad=MASKED)
    # One imshow per panel (not a pcolormesh of cells): one raster, fast in every format.
    return ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")


def _ticks(
    ax: Axes,
    axis: str,
    labels: Sequence[str],
    cell: float,
    pt: float,
    *,
    show: bool,
    bold: Sequence[int] = (),
    dim: Sequence[bool] = (),
) -> None:
    """Label an axis with ``labels`` once per grid axis, thinned so that no two overlap.

    ``cell`` is the size (inches) of one row/column; x labels are rotated to vertical,
    so along either axis a label needs one line height of room.
    """
    n = len(labels)
    step = max(1, math.ceil(_line_in(pt) * 1.1 / cell))
    keep = list(range(0, n, step))
    for b in bold:  # the chosen token is always labelled; its close neighbours make room
        keep = [k for k in keep if abs(k - b) >= step or k == b]
        if b not in keep:
            keep = sorted([*keep, b])
    ax.tick_params(axis="x" if axis == "x" else "y", length=0, pad=2, labelsize=pt)
    x = axis == "x"
    (ax.set_xticks if x else ax.set_yticks)(keep if show else [])
    if not show:
        return
    shown = [labels[k] for k in keep]
    texts = ax.set_xticklabels(shown, rotation=90) if x else ax.set_yticklabels(shown)
    for k, text in zip(keep, texts):
        text.set_parse_math(False)  # a "$" in a token is text, not mathtext
        if k in bold:
            text.set_fontweight("bold")
            text.set_color("#c00000")
        elif dim and dim[k]:
            text.set_color("0.45")


def _colorbar(fig: Figure, grid: _Grid, image: AxesImage, pt: float) -> None:
    """One colour bar for all panels, right of the grid and as tall as it."""
    x = grid.left + grid.grid_w + 0.12
    cax = fig.add_axes(
        (x / grid.width, grid.bottom / grid.height, _COLORBAR_IN / grid.width, grid.grid_h / grid.height)
    )
    bar = fig.colorbar(image, cax=cax)
    bar.set_label("attention weight", fontsize=pt)
    bar.ax.tick_params(labelsize=pt)
