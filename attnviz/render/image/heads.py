"""``attnviz heads -o heads.png|svg|pdf``: one layers × heads panel per detector.

Built like render/image/ (matplotlib object API on an Agg canvas, no pyplot, layout
computed in inches, atomic write); tests read the drawn data back from
``ax.images[0].get_array()``.

Shape legend: N layers, H heads.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from ...corpus.scan import ScanReport
from ...measures.base import measure_named
from ...result import Provenance
from ...shape import head_label
from .. import FigureStyle
from .layout import _char_in, _colorbar, _figure, _heatmap, _layout, _ticks, _title


def panels(report: ScanReport) -> list[tuple[str, np.ndarray]]:
    """(title, (N, H) values in 0..1) of every panel, detectors first, coreference last."""
    acc = report.heads
    out = []
    for d, name in enumerate(acc.detectors):
        title = f"{name} (n={int(acc.count[d])})" + (" · low = focused" if name == "entropy" else "")
        out.append((title, np.clip(acc.mean[d], 0.0, 1.0)))
    if report.coref is not None and report.coref.total:
        title = f"coreference accuracy (n={report.coref.total}; nearest {report.coref.baseline:.2f})"
        out.append((title, report.coref.accuracy.astype(np.float64)))
    return out


def heads_figure(
    report: ScanReport, p: Provenance, style: FigureStyle | None = None, measure: str = "weight"
) -> Figure:
    """A grid of panels, one per detector: rows are layers, columns heads, the colour the
    head's mean score over the corpus on one shared 0..1 scale."""
    style = style or FigureStyle()
    pt = style.fontsize
    shown = panels(report)
    layers = report.heads.layers
    n_heads = report.heads.num_heads
    ncols = min(len(shown), 3)
    nrows = math.ceil(len(shown) / ncols)
    head_names = [head_label(h, p.num_heads, p.num_kv_heads) for h in range(n_heads)]
    layer_names = [f"L{layer}" for layer in layers]
    what = f"{report.texts} texts" + (" (PARTIAL: interrupted)" if report.partial else "")
    grid, head, sub = _layout(
        nrows,
        ncols,
        n_x=n_heads,
        n_y=len(layers),
        cell_h=None,
        ylabel_w=_char_in(pt) * max(len(s) for s in layer_names) + 0.12,
        xlabel_h=_char_in(pt) * max(len(s) for s in head_names) + 0.12,
        hgap=0.3,
        sentence=f"{p.model}: what each head does over {what}",
        subtitle=f"engine {p.engine} · {p.device} · mean score per head over the corpus (layers × heads)"
        + ("" if not (m := measure_named(measure)).needs_values else f" · measure: {m.name} shares ({m.citation})"),
        style=style,
        max_w=style.figsize[0] if style.figsize else None,
    )
    fig = _figure(grid)
    if style.title:
        # _layout quotes its first line as a sentence; this title is not one.
        _title(fig, grid, [line.strip("“”") for line in head], sub, pt)
    image: AxesImage | None = None
    for i, (title, values) in enumerate(shown):
        ax = fig.add_axes(grid.rect(i))
        image = _heatmap(ax, values, None, style, 1.0)
        ax.set_title(title, fontsize=pt, pad=3, loc="left")
        _ticks(ax, "x", head_names, grid.cell_w, pt, show=i + ncols >= len(shown))
        _ticks(ax, "y", layer_names, grid.cell_h, pt, show=i % ncols == 0)
    if image is not None:
        _colorbar(fig, grid, image, pt)
        fig.axes[-1].set_ylabel("mean score", fontsize=pt)
    return fig
