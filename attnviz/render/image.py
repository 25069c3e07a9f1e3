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

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.patches import Rectangle

from ..errors import UsageError
from ..result import Attention, atomic_write, check_writable
from . import DEFAULT_DPI, IMAGE_FORMATS

CMAP = "viridis"  # perceptually uniform and readable with the common colour-vision deficiencies
MASKED = "#d0d0d0"  # light grey: not on the viridis ramp, so a masked cell never reads as a weight

# Sizes in inches / points. Cells shrink for long sentences down to _MIN_CELL; labels
# then thin out instead of overlapping.
_TICK_PT = 7.0
_LINE_IN = _TICK_PT * 1.25 / 72  # height of one line of tick text
_CHAR_IN = _TICK_PT * 0.62 / 72  # a generous average glyph width (DejaVu Sans)
_MAX_LABEL = 14  # characters; longer token labels are cut with "…"
_MAX_GRID_W = 15.0  # the panels' total width never exceeds this
_MIN_CELL = 0.03
_PANEL_TITLE_IN = 0.24
_COLORBAR_IN = 0.14
_TITLE_PT = 10.0
_SUBTITLE_PT = 7.5


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


def token_figure(att: Attention, query: int, layers: Sequence[int] | None = None) -> Figure:
    """One token's attention: per layer, a panel of heads (rows) × tokens (columns).

    With several layers the panels go on a grid with one shared colour scale (0..1,
    the same in every layer and every figure) and one colour bar. For causal models
    the tokens after ``query`` cannot be attended to and are drawn masked (grey).

    Raises:
        UsageError: ``query`` was not kept as a query row or a layer was not computed.
    """
    layers = tuple(att.layers if layers is None else layers)
    if not layers:
        raise UsageError("no layers to draw", hint="give at least one layer")
    rows = att.rows(query)  # (N, H, S)
    labels = att.keys.labels  # the columns: the source tokens, for cross-attention
    p = att.provenance
    n_heads, n_tok = rows.shape[1], rows.shape[2]
    # Wide sentences get fewer columns so each panel keeps readable cells.
    ncols = min(len(layers), 3 if n_tok <= 20 else 2 if n_tok <= 40 else 1)
    nrows = math.ceil(len(layers) / ncols)
    cell_w = _cell(n_tok * ncols)
    cell_h = 0.16
    head_names = [p.shape.head_label(h) for h in range(n_heads)]
    short = [_short(s) for s in labels]
    subtitle = (
        f"{p.model} · engine {p.engine} · {_layers_text(layers)} · "
        f"token {att.tokens.labels[query]!r} (position {query}) → each "
        f"{'source token' if att.part == 'cross' else 'token'}, per head"
    )
    if att.part is not None:
        subtitle += f" · {_PART_NAMES[att.part]}"
    if p.causal:
        subtitle += " · causal: later tokens masked (grey)"
    grid, head, sub = _layout(
        nrows,
        ncols,
        panel_w=n_tok * cell_w,
        panel_h=n_heads * cell_h,
        ylabel_w=_CHAR_IN * max(len(s) for s in head_names) + 0.12,
        xlabel_h=_CHAR_IN * max(len(s) for s in short) + 0.12,
        hgap=0.12,
        sentence=_texts(att),
        subtitle=subtitle,
    )
    fig = _figure(grid)
    _title(fig, grid, head, sub)
    mask = np.arange(n_tok) > query if p.causal else None  # (S,)
    image: AxesImage | None = None
    for i, layer in enumerate(layers):
        data = rows[att.layer_slot(layer)]  # (H, S)
        ax = fig.add_axes(grid.rect(i))
        image = _heatmap(ax, data, None if mask is None else np.broadcast_to(mask, data.shape))
        _pair_rules(ax, att, rows=False)
        ax.set_title(f"layer {layer}", fontsize=8, pad=3, loc="left")
        # Label each grid axis once: tokens under the bottom panel of each column, heads
        # left of the first column.
        bottom_of_column = i + ncols >= len(layers)
        bold = (query,) if att.is_self_attention else ()
        _ticks(ax, "x", short, cell_w, show=bottom_of_column, bold=bold, dim=att.keys.special)
        _ticks(ax, "y", head_names, cell_h, show=i % ncols == 0)
    assert image is not None  # layers is not empty (checked above)
    _colorbar(fig, grid, image)
    return fig


def matrix_figure(att: Attention, layer: int, highlight: Sequence[int] = ()) -> Figure:
    """One layer's full query × key matrix for each head, as a grid of panels.

    Tokens are labelled on the outer axes only (keys under the bottom row, queries left
    of the first column). Rows in ``highlight`` (token positions) are outlined. For
    causal models the upper triangle (a query looking at later tokens) is masked.

    Raises:
        UsageError: ``layer`` was not computed, or a highlighted token is not a kept query.
    """
    mats = att.matrix(layer)  # (H, Q, S)
    n_heads, n_q, n_tok = mats.shape
    p = att.provenance
    # A near-square grid of square panels; long sentences shrink the cells (and thin the
    # labels) rather than grow the page past _MAX_GRID_W in either direction.
    ncols = math.ceil(math.sqrt(n_heads))
    nrows = math.ceil(n_heads / ncols)
    cell = min(0.16, _cell(n_tok * ncols, smallest=0.01), _cell(n_tok * nrows, smallest=0.01))
    short = [_short(s) for s in att.keys.labels]  # columns: keys (the source, for cross-attention)
    q_short = [_short(att.tokens.labels[q]) for q in att.queries]
    label_in = _CHAR_IN * max(len(s) for s in (*short, *q_short)) + 0.12
    subtitle = f"{p.model} · engine {p.engine} · layer {layer} · each head: query (row) → key (column)"
    if att.part is not None:
        subtitle += f" · {_PART_NAMES[att.part]}"
    if p.causal:
        subtitle += " · causal: the masked (grey) upper triangle is future tokens"
    grid, head, sub = _layout(
        nrows,
        ncols,
        panel_w=n_tok * cell,
        panel_h=n_q * cell,
        ylabel_w=label_in,
        xlabel_h=label_in,
        hgap=0.1,
        sentence=_texts(att),
        subtitle=subtitle,
    )
    fig = _figure(grid)
    _title(fig, grid, head, sub)
    # (Q, S): True where query queries[q] may not see key s.
    mask = np.arange(n_tok)[None, :] > np.array(att.queries)[:, None] if p.causal else None
    rows_hl = [att.query_slot(q) for q in highlight]
    image: AxesImage | None = None
    for h in range(n_heads):
        ax = fig.add_axes(grid.rect(h))
        image = _heatmap(ax, mats[h], mask)
        _pair_rules(ax, att, rows=True)
        ax.set_title(p.shape.head_label(h), fontsize=8, pad=3, loc="left")
        for r in rows_hl:
            ax.add_patch(Rectangle((-0.5, r - 0.5), n_tok, 1, fill=False, edgecolor="#ff3030", linewidth=1.0))
        _ticks(ax, "x", short, cell, show=h + ncols >= n_heads, dim=att.keys.special)
        dim_q = tuple(att.tokens.special[q] for q in att.queries)
        _ticks(ax, "y", q_short, cell, show=h % ncols == 0, bold=tuple(rows_hl), dim=dim_q)
    assert image is not None  # a model has at least one head
    _colorbar(fig, grid, image)
    return fig


_PART_NAMES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention: decoder (rows) → source (columns)",
}


def _pair_rules(ax: Axes, att: Attention, rows: bool) -> None:
    """A sentence pair: a white rule before sentence B's first key column (and, with
    ``rows``, before its first query row)."""
    start = att.keys.pair_start
    if start is None:
        return
    ax.axvline(start - 0.5, color="white", linewidth=1.2)
    if rows and att.is_self_attention:
        # Query rows are the kept queries; the rule goes before the first one in sentence B.
        below = [i for i, q in enumerate(att.queries) if q >= start]
        if below and below[0] > 0:
            ax.axhline(below[0] - 0.5, color="white", linewidth=1.2)


def _texts(att: Attention) -> str:
    """The text(s) the figure is about: for cross-attention, target and source."""
    if att.key_tokens is None:
        return att.tokens.text
    return f"{att.tokens.text}  ←  {att.keys.text}"


def save_figure(fig: Figure, path: Path, dpi: int = DEFAULT_DPI) -> None:
    """Write ``fig`` to ``path`` in the format its extension names, atomically.

    Raises:
        OutputError: the extension is not .png/.svg/.pdf, or the file cannot be written.
    """
    path = check_writable(Path(path), IMAGE_FORMATS)
    if not 10 <= dpi <= 2400:
        raise UsageError(f"dpi {dpi} is out of range", hint="use a dpi between 10 and 2400 (e.g. 150 or 300)")
    fmt = path.suffix.lower().lstrip(".")

    def write(tmp: Path) -> None:
        # The temporary name ends in .tmp, so say the format; metadata without dates
        # keeps the files reproducible.
        metadata = {"Software": None} if fmt == "png" else {"Date": None} if fmt == "svg" else {"CreationDate": None}
        fig.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata)

    atomic_write(path, write)


# --- layout helpers -----------------------------------------------------------


def _cell(columns: int, smallest: float = _MIN_CELL) -> float:
    """Cell size (inches) so that ``columns`` cells fit the maximum grid width."""
    return max(smallest, min(0.26, _MAX_GRID_W / max(columns, 1)))


def _short(label: str) -> str:
    return label if len(label) <= _MAX_LABEL else label[: _MAX_LABEL - 1] + "…"


def _layout(
    nrows: int,
    ncols: int,
    *,
    panel_w: float,
    panel_h: float,
    ylabel_w: float,
    xlabel_h: float,
    hgap: float,
    sentence: str,
    subtitle: str,
) -> tuple[_Grid, list[str], list[str]]:
    """Place the panel grid inside margins for labels, title and colour bar.

    Returns the grid and the title's sentence lines and subtitle lines, wrapped to the
    figure's width (the sentence to at most two lines).
    """
    left = ylabel_w + 0.1
    bottom = xlabel_h + 0.1
    right = 0.12 + _COLORBAR_IN + 0.55  # gap, bar, its tick labels and caption
    vgap = _PANEL_TITLE_IN
    grid_w = ncols * panel_w + (ncols - 1) * hgap
    grid_h = nrows * panel_h + (nrows - 1) * vgap
    width = max(left + grid_w + right, 6.0)  # room for a readable title line
    head = textwrap.wrap(f"“{sentence.strip()}”", _fit(width, _TITLE_PT), max_lines=2, placeholder=" …”")
    sub = textwrap.wrap(subtitle, _fit(width, _SUBTITLE_PT), max_lines=2, placeholder=" …")
    top = 0.12 + _lines_in(len(head), _TITLE_PT) + 0.06 + _lines_in(len(sub), _SUBTITLE_PT) + _PANEL_TITLE_IN + 0.02
    height = bottom + grid_h + top
    return _Grid(nrows, ncols, panel_w, panel_h, left, bottom, hgap, vgap, width, height), head, sub


def _fit(width: float, points: float) -> int:
    """How many characters of ``points``-size text fit in ``width`` inches (minus margins)."""
    return max(int((width - 0.2) / (points * 0.62 / 72)), 20)


def _lines_in(n: int, points: float) -> float:
    return n * points * 1.3 / 72


def _figure(grid: _Grid) -> Figure:
    fig = Figure(figsize=(grid.width, grid.height))
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: drawing works without pyplot
    return fig


def _title(fig: Figure, grid: _Grid, head: list[str], sub: list[str]) -> None:
    """The sentence, quoted, then a grey line of provenance, above the grid."""
    x = 0.1 / grid.width
    y = 1 - 0.12 / grid.height
    # parse_math=False: a "$" in a sentence or token is text, not the start of mathtext.
    fig.text(x, y, "\n".join(head), ha="left", va="top", fontsize=_TITLE_PT, linespacing=1.2, parse_math=False)
    y -= (_lines_in(len(head), _TITLE_PT) + 0.06) / grid.height
    fig.text(
        x, y, "\n".join(sub), ha="left", va="top", fontsize=_SUBTITLE_PT, color="0.3", linespacing=1.2, parse_math=False
    )


def _layers_text(layers: Sequence[int]) -> str:
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}–{layers[-1]}"
    return "layers " + ",".join(str(x) for x in layers)


def _heatmap(ax: Axes, data: np.ndarray, mask: np.ndarray | None) -> AxesImage:
    """One panel: ``data`` (rows × columns) on the shared 0..1 viridis scale."""
    cmap: Colormap | str = CMAP
    shown: np.ndarray = data
    if mask is not None:
        shown = np.ma.masked_array(data, mask=mask)
        from matplotlib import colormaps

        cmap = colormaps[CMAP].with_extremes(bad=MASKED)
    # One imshow per panel (not a pcolormesh of cells): one raster, fast in every format.
    return ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")


def _ticks(
    ax: Axes,
    axis: str,
    labels: Sequence[str],
    cell: float,
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
    step = max(1, math.ceil(_LINE_IN * 1.1 / cell))
    keep = list(range(0, n, step))
    for b in bold:  # the chosen token is always labelled; its close neighbours make room
        keep = [k for k in keep if abs(k - b) >= step or k == b]
        if b not in keep:
            keep = sorted([*keep, b])
    ax.tick_params(axis="x" if axis == "x" else "y", length=0, pad=2, labelsize=_TICK_PT)
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


def _colorbar(fig: Figure, grid: _Grid, image: AxesImage) -> None:
    """One colour bar for all panels, right of the grid and as tall as it."""
    x = grid.left + grid.grid_w + 0.12
    cax = fig.add_axes(
        (x / grid.width, grid.bottom / grid.height, _COLORBAR_IN / grid.width, grid.grid_h / grid.height)
    )
    bar = fig.colorbar(image, cax=cax)
    bar.set_label("attention weight", fontsize=_TICK_PT)
    bar.ax.tick_params(labelsize=_TICK_PT)
