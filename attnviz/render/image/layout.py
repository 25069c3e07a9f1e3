"""The layout of the image views, computed by hand in inches, and the drawing
primitives image/__init__.py and image/heads.py share (heatmap, ticks, title, colour bar).

No ``tight_layout``/constrained layout (slow, and their result depends on the
renderer): the panels' grid is sized from the number of heads and tokens, cells shrink
for long sentences down to a floor, and then tokens are binned into blocks and the
labels thin out instead of overlapping. matplotlib object API only, no pyplot.

Shape legend: H heads, Q query positions, S tokens.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from ...errors import UsageError
from .. import FigureStyle

MASKED = "#d0d0d0"  # light grey: not on the viridis ramp, so a masked cell never reads as a weight

# Sizes in inches / points, for tick labels of ``pt`` points (FigureStyle.fontsize). Cells
# shrink for long sentences down to _MIN_CELL; labels then thin out instead of overlapping.
_MAX_LABEL = 14  # characters; longer token labels are cut with "…"
_MAX_GRID_W = 15.0  # the panels' total width never exceeds this
_MIN_CELL = 0.03
_MIN_MATRIX_CELL = 0.01  # the matrix view's cells may be smaller: a matrix reads as a texture
_MIN_FIXED_CELL = 0.005  # with a fixed figure size (style.figsize), cells may shrink this far
_COLORBAR_IN = 0.14


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
    must: Sequence[int] = (),
    always: Sequence[int] = (),
    mode: str = "auto",
) -> None:
    """Label an axis with ``labels`` once per grid axis, thinned so that no two overlap.

    ``cell`` is the size (inches) of one row/column; x labels are rotated to vertical,
    so along either axis a label needs one line height of room. ``mode`` "all" labels
    every cell (labels may touch), "none" none; "auto" labels ``bold`` (the chosen token)
    and ``always`` (the targets a user named) whatever their spacing, then ``must`` in its
    order (the strongest keys, strongest first) unless one would overprint a label
    already kept, then fills the gaps between them from the left at the thinned spacing.
    """
    n = len(labels)
    step = max(1, math.ceil(_line_in(pt) * 1.1 / cell))  # a label and a little air
    # Closer than one em (a glyph's height, without the line's leading), two labels overprint.
    touch = max(1, math.ceil(pt / 72 / cell - 1e-9))
    if mode == "all":
        keep = list(range(n))
    elif mode == "none":
        keep = []
    else:
        chosen = list(dict.fromkeys(k for k in [*bold, *always] if 0 <= k < n))
        for k in must:
            if 0 <= k < n and all(abs(k - j) >= touch for j in chosen):
                chosen.append(k)
        keep = sorted(chosen)
        for k in range(n):
            if all(abs(k - j) >= step for j in keep):
                keep = sorted([*keep, k])
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


def _colorbar(fig: Figure, grid: _Grid, image: AxesImage, pt: float, label: str = "attention weight") -> None:
    """One colour bar for all panels, right of the grid and as tall as it."""
    x = grid.left + grid.grid_w + 0.12
    cax = fig.add_axes(
        (x / grid.width, grid.bottom / grid.height, _COLORBAR_IN / grid.width, grid.grid_h / grid.height)
    )
    bar = fig.colorbar(image, cax=cax)
    bar.set_label(label, fontsize=pt)
    bar.ax.tick_params(labelsize=pt)
