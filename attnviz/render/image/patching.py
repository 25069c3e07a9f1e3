"""``attnviz patch -o effects.png|svg|pdf``: the layers × heads patching effects.

Built like render/image/heads.py (matplotlib object API, no pyplot, layout computed in
inches, atomic write through ``save_figure``); the drawn data reads back from
``ax.images[0].get_array()``. The scale diverges (RdBu) and is symmetric about 0, at
least ±1 (1 = the clean run), wider when an effect overshoots.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ...measures.patchpairs import PairsResult
from ...measures.patchresult import PatchResult
from .. import FigureStyle
from .layout import _char_in, _colorbar, _figure, _layout, _ticks, _title


def patch_figure(result: PatchResult | PairsResult, style: FigureStyle | None = None) -> Figure:
    """One panel: rows are layers, columns heads, the colour each head's normalised effect
    (over a file of pairs: its mean)."""
    from matplotlib import colormaps

    style = style or FigureStyle()
    pt = style.fontsize
    values, heads, cell_what = result.grid()
    layers = [f"L{n}" for n in range(result.num_layers)]
    finite = values[np.isfinite(values)]
    top = max(1.0, float(np.abs(finite).max()) if finite.size else 1.0)
    grid, head, sub = _layout(
        1,
        1,
        n_x=len(heads),
        n_y=result.num_layers,
        cell_h=None,
        ylabel_w=_char_in(pt) * max(len(s) for s in layers) + 0.12,
        xlabel_h=_char_in(pt) * max(len(s) for s in heads) + 0.12,
        hgap=0.3,
        sentence=f"{result.model}: activation patching, {result.direction}"
        + (" (PARTIAL: interrupted)" if result.partial else ""),
        subtitle=result.what() + f" · cells: {cell_what}",
        style=style,
        max_w=style.figsize[0] if style.figsize else None,
    )
    fig = _figure(grid)
    if style.title:
        _title(fig, grid, [line.strip("“”") for line in head], sub, pt)
    ax = fig.add_axes(grid.rect(0))
    cmap = colormaps["RdBu"].with_extremes(bad="0.85")
    image = ax.imshow(
        np.ma.masked_invalid(values), cmap=cmap, vmin=-top, vmax=top, aspect="auto", interpolation="nearest"
    )
    _ticks(ax, "x", heads, grid.cell_w, pt, show=True)
    _ticks(ax, "y", layers, grid.cell_h, pt, show=True)
    _colorbar(fig, grid, image, pt, label="effect (1 = clean, 0 = corrupted)")
    return fig
