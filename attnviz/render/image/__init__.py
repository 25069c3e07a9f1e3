"""Image views built with matplotlib: per-head heatmaps as PNG, SVG or PDF.

Renderers take data (an ``Attention``), never models. Each view is a pure function
returning a matplotlib ``Figure`` built with the object API on an Agg canvas: no
pyplot, so no global state, no GUI backend, and tests can read the drawn data back
from ``ax.images[0].get_array()``.

This module imports matplotlib at import time; only code that writes an image
imports it (``attnviz --help`` must not pay for matplotlib).

Layout is computed by hand, in inches, from the number of heads and tokens
(render.image.layout): no ``tight_layout``/constrained layout, and the saved pixel size is
exactly ``figsize × dpi``.

Shape legend: N layers, H heads, Q query positions, S tokens.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.patches import Rectangle

from ...errors import Reason, UsageError
from ...result import Attention, atomic_write, check_writable
from .. import COLUMN_IN, DEFAULT_DPI, DEFAULT_FONT_PT, IMAGE_FORMATS, FigureStyle
from .layout import (
    _bin,
    _bin_all,
    _block_labels,
    _capacity,
    _char_in,
    _colorbar,
    _figure,
    _heatmap,
    _layers_text,
    _layout,
    _short,
    _ticks,
    _title,
)

# The largest image drawn: 100 million pixels, a 400 MB RGBA buffer (an unbounded --dpi
# on a 500-token matrix asked matplotlib for 11 GB).
MAX_PIXELS = 100_000_000


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


def _bar_label(att: Attention) -> str:
    """The colour bar's name for what a cell shows (the measure)."""
    from ...transforms import measure_label

    label = measure_label(att)
    return "attention weight" if label == "weight" else f"{label} (Kobayashi et al. 2020)"


def _steps_text(att: Attention) -> str:
    tags = [step.split(":", 1)[0] for step in att.steps]
    return " · " + "; ".join(tags) if tags else ""


# A generation's figures (--generate): the written tokens' labels are marked «like this».
_WRITTEN_NOTE = " · «…»: written by the model"


def token_figure(
    att: Attention,
    query: int,
    layers: Sequence[int] | None = None,
    style: FigureStyle | None = None,
    targets: Sequence[int] = (),
) -> Figure:
    """One token's attention: per layer, a panel of heads (rows) × tokens (columns).

    With several layers the panels go on a grid with one shared colour scale (0..1 by
    default, the same in every layer and every figure; ``style.vmax`` changes the top)
    and one colour bar. Aggregate slots (head mean/max, rollout) are extra rows below a
    white rule. Tokens set aside (``att.hidden``) are not drawn. For causal models the
    tokens after ``query`` cannot be attended to and are drawn masked (grey).

    The token labels (``style.xlabels`` "auto") keep the finding when they must thin out:
    the query, ``targets`` (key positions) and each drawn row's strongest key in each
    drawn layer are labelled first (the strongest first), the others around them.

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
        + _WRITTEN_NOTE * (att.tokens.written_start is not None)
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
    where = {c: n for n, c in enumerate(cols)}
    marked = tuple(where[t] // block for t in targets if t in where)
    must = _peaks(shown)
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
        _ticks(
            ax,
            "x",
            short,
            grid.cell_w,
            pt,
            show=bottom_of_column,
            bold=bold,
            dim=dim,
            must=must,
            always=marked,
            mode=style.xlabels,
        )
        _ticks(ax, "y", head_names, grid.cell_h, pt, show=i % ncols == 0)
    assert image is not None  # layers is not empty (checked above)
    _colorbar(fig, grid, image, pt, _bar_label(att))
    return fig


def _peaks(shown: Sequence[np.ndarray]) -> list[int]:
    """The columns a thinned axis should still name: each drawn row's strongest column in
    each panel (``shown``: each (H', S'/block), masked where the key is in the future),
    the strongest first."""
    peaks: list[tuple[float, int]] = []
    for d in shown:
        filled: np.ndarray = np.ma.filled(np.ma.asarray(d, dtype=float), -1.0)  # (H', S'/block)
        for row in filled:
            k = int(np.argmax(row))
            if row[k] >= 0:
                peaks.append((float(row[k]), k))
    peaks.sort(key=lambda p: (-p[0], p[1]))
    return list(dict.fromkeys(k for _, k in peaks))


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
    subtitle += _WRITTEN_NOTE * (att.tokens.written_start is not None)
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
        _ticks(ax, "x", short, grid.cell_w, pt, show=i + ncols >= n_panels, dim=dim_k, mode=style.xlabels)
        _ticks(ax, "y", q_short, grid.cell_h, pt, show=i % ncols == 0, bold=tuple(rows_hl), dim=dim_q)
    assert image is not None  # a model has at least one head
    _colorbar(fig, grid, image, pt, _bar_label(att))
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
            reason=Reason.PIXELS,
            largest=largest,
        )


def save_figure(fig: Figure, path: Path, dpi: int = DEFAULT_DPI) -> tuple[str, ...]:
    """Write ``fig`` to ``path`` in the format its extension names, atomically; return
    the characters of its labels that no font drew (CJK or emoji without a font that has
    them: empty boxes), for the caller to say in one line.

    Fonts installed for such scripts (Noto CJK, WenQuanYi, Noto Emoji...) are fallbacks
    after matplotlib's own; matplotlib's warning per missing glyph (8 UserWarnings for
    one CJK label) is collected instead of printed.

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
    import warnings

    from matplotlib import rc_context

    buffer = io.BytesIO()
    rc: Any = {**PAPER_RC, **_fallback_fonts()}  # Any: matplotlib types rc keys as literals
    with rc_context(rc), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        fig.savefig(buffer, format=fmt, dpi=dpi, metadata=metadata)
    missing: list[str] = []
    for w in caught:
        found = _MISSING_GLYPH.match(str(w.message))
        if found is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)  # not ours to hide
        elif chr(int(found[1])) not in missing:
            missing.append(chr(int(found[1])))
    atomic_write(path, buffer.getvalue())
    return () if fmt == "svg" else tuple(missing)  # SVG text is drawn by the viewer's fonts


# matplotlib's "Glyph 26481 (\\N{CJK UNIFIED IDEOGRAPH-6771}) missing from font(s) DejaVu Sans."
_MISSING_GLYPH = re.compile(r"Glyph (\d+) .*missing from (?:current )?font")
# Families with the glyphs DejaVu Sans lacks, used where installed (matplotlib >= 3.6
# falls back along font.family per glyph).
_FALLBACKS = (
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "Source Han Sans",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
    "Noto Sans Thai",
    "Noto Color Emoji",
    "Noto Emoji",
    "Symbola",
)


def _fallback_fonts() -> dict[str, Any]:
    from matplotlib import font_manager, rcParams

    installed = {f.name for f in font_manager.fontManager.ttflist}
    extra = [name for name in _FALLBACKS if name in installed]
    if not extra:
        return {}
    return {"font.family": [*rcParams["font.sans-serif"][:1], *extra]}


# --- binning long inputs --------------------------------------------------------
