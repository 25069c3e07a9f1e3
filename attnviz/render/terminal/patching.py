"""``attnviz patch``'s terminal view: a layers × heads heatmap of the patching effects and
the ranked heads, every line labelled with what was patched, the direction and the metric.

Effects are signed (0 = the corrupted run, 1 = the clean one; a head can overshoot or
push the other way), so the scale diverges: blue for positive, red for negative, white
at 0, full at |effect| ≥ 1. Without colour (NO_COLOR, a pipe) each cell shows its value
and a shade glyph of |effect|, with "−" for a negative one.
"""

from __future__ import annotations

import numpy as np
from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text

from ...measures.attribution import Attribution
from ...measures.patchpairs import PairsResult
from ...measures.patchresult import PatchResult
from ...measures.versus import Versus
from .glyphs import shade

_POSITIVE = np.array((33, 102, 172), dtype=float)  # RdBu's blue end
_NEGATIVE = np.array((178, 24, 43), dtype=float)  # RdBu's red end
_WHITE = np.array((247, 247, 247), dtype=float)


def effect_colour(value: float) -> str:
    """'#rrggbb' of a signed effect on the diverging scale (clipped at ±1)."""
    x = min(abs(float(value)), 1.0)
    end = _POSITIVE if value >= 0 else _NEGATIVE
    r, g, b = _WHITE + x * (end - _WHITE)
    return f"#{round(r):02x}{round(g):02x}{round(b):02x}"


def _short(value: float) -> str:
    """A signed effect in 4 characters: +.13, −.04, +1.2, +12."""
    if abs(value) < 0.995:
        text = f"{value:+.2f}".replace("0.", ".", 1)
    elif abs(value) < 9.95:
        text = f"{value:+.1f}"
    else:
        text = f"{value:+.0f}"
    return text.replace("-", "−")


def _cell(value: float, color: bool) -> Text:
    if not np.isfinite(value):
        return Text("  –  ", style="dim")
    label = _short(value).rjust(4)
    if not color:
        return Text(label + shade(min(abs(value), 1.0)))
    label += " "
    dark = abs(value) > 0.55
    return Text(label, style=Style(color="white" if dark else "black", bgcolor=effect_colour(value)))


def _units(result: PatchResult) -> str:
    """What one column is: a head, or a key/value head (k and v under grouped-query attention)."""
    return "key/value heads" if result.group > 1 else "heads"


def patch_view(result: PatchResult, *, top: int = 10, color: bool = True) -> RenderableType:
    """The heatmap (rows: layers, columns: heads), its scale, the clean and corrupted
    scores, and the ``top`` heads by |effect|."""
    parts: list[RenderableType] = []
    if result.partial:
        parts.append(Text("PARTIAL: interrupted; the heads not patched show –", style="bold"))
    parts.append(
        Text(
            f"{result.model} · engine {result.engine} · {result.num_layers} layers"
            + (f" × {result.num_heads} {_units(result)}" if result.num_heads else ""),
            style="dim",
        )
    )
    parts.append(Text(result.what(), style="dim"))
    parts.append(
        Text(
            f"clean {result.metric_label} = {result.clean_score + 0.0:.4g}; "
            f"corrupted = {result.corrupted_score + 0.0:.4g}; "
            f"differing: {result.alignment.describe()}",
            style="dim",
        )
    )
    values, columns, cell_what = result.grid()
    rows = [f"L{layer}" for layer in range(values.shape[0])]
    if result.axes == ("layer", "position"):  # tokens down, layers across (causal tracing's figure)
        values, rows, columns = values.T, [f"{label} ({p})" for label, p in zip(columns, result.positions)], rows
    grid = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold", padding=(0, 0, 0, 1))
    grid.add_column("", justify="right", no_wrap=True)
    for label in columns:
        grid.add_column(label, justify="center", no_wrap=True)
    for row, line in zip(rows, values):
        grid.add_row(row, *(_cell(float(v), color) for v in line))
    if cell_what != "each head's effect":
        parts.append(Text(f"cells: {cell_what}", style="dim"))
    parts.append(grid)
    scale = Text("scale: ")
    for v in (-1.0, -0.5, 0.0, 0.5, 1.0):
        scale.append_text(_cell(v, color))
        scale.append(" ")
    scale.append(" effect (1 = the clean run's metric, 0 = the corrupted run's)", style="dim")
    parts.append(scale)
    ranked = result.ranked_units(top)
    if ranked:
        noun = _units(result) if result.axes == ("layer", "head") else "patches"
        table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold", title_justify="left")
        table.add_column("rank", justify="right")
        table.add_column("head" if noun.endswith("heads") else "patched", no_wrap=True)
        table.add_column("effect", justify="right")
        table.add_column(result.metric_label, justify="right")
        for k, (label, value, raw) in enumerate(ranked, 1):
            table.add_row(str(k), label, _cell(value, color), f"{raw + 0.0:.4g}")
        parts.append(Text(f"top {len(ranked)} {noun} by |effect|:", style="bold"))
        parts.append(table)
    for note in result.notes:
        parts.append(Text(note, style="dim"))
    return Group(*parts)


def attribution_view(result: Attribution, *, top: int = 10, color: bool = True) -> RenderableType:
    """The sum check, the heads' contributions (layers × heads, with each layer's MLP and
    W^O bias), the ``top`` components by |contribution| and the logit lens."""
    parts: list[RenderableType] = [
        Text(f"{result.model} · engine {result.engine}", style="dim"),
        Text(result.label(), style="dim"),
    ]
    check = (
        f"sum check: Σ components = {result.total:.6g}; logit({result.answer}) − logit({result.wrong}) = "
        f"{result.logit_diff:.6g}; error {result.sum_error:+.2e}"
    )
    parts.append(Text(check, style="bold"))
    scale = max(1e-12, float(np.abs(result.heads).max()), float(np.abs(result.mlps).max()))
    grid = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold", padding=(0, 0, 0, 1))
    grid.add_column("", justify="right", no_wrap=True)
    for head in range(result.heads.shape[1]):
        grid.add_column(f"H{head}", justify="right", no_wrap=True)
    grid.add_column("mlp", justify="right", no_wrap=True)
    grid.add_column("bias", justify="right", no_wrap=True)

    def cell(value: float) -> Text:
        label = f"{value:+.2f}"
        if not color:
            return Text(label)
        shown = value / scale
        return Text(label, style=Style(color="white" if abs(shown) > 0.55 else "black", bgcolor=effect_colour(shown)))

    for layer in range(result.heads.shape[0]):
        grid.add_row(
            f"L{layer}",
            *(cell(v) for v in result.heads[layer]),
            cell(float(result.mlps[layer])),
            cell(float(result.attn_biases[layer])),
        )
    parts.append(grid)
    parts.append(
        Text(
            f"embeddings {result.embeddings:+.3f}; other biases (final norm's β, b_U) {result.biases:+.3f}", style="dim"
        )
    )
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    table.add_column("rank", justify="right")
    table.add_column("component", no_wrap=True)
    table.add_column("contribution", justify="right")
    for k, (name, value) in enumerate(result.ranked(top), 1):
        table.add_row(str(k), name, f"{value:+.4f}")
    parts.append(Text(f"top {min(top, len(result.components()))} components by |contribution|:", style="bold"))
    parts.append(table)
    lens = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    lens.add_column("after", no_wrap=True)
    lens.add_column(f"logit({result.answer}) − logit({result.wrong})", justify="right")
    lens.add_column("top tokens (logit)")
    for layer, tops in enumerate(result.lens):
        lens.add_row(
            f"L{layer}",
            f"{result.lens_diff[layer]:+.3f}",
            "  ".join(f"{t} {v:.2f}" for t, v in tops),
        )
    parts.append(
        Text(
            f"logit lens at {result.tokens[result.position]!r}: each layer's stream through the final norm and W_U",
            style="bold",
        )
    )
    parts.append(lens)
    return Group(*parts)


def pairs_view(result: PairsResult, *, top: int = 10, color: bool = True) -> RenderableType:
    """Over a file of pairs: the heatmap of each head's mean effect, and the ``top`` heads
    by |mean| with their bootstrap intervals and how many pairs each mean is over."""
    parts: list[RenderableType] = []
    if result.partial:
        parts.append(Text(f"PARTIAL: interrupted after {len(result.pairs)} of {result.total} pairs", style="bold"))
    parts.append(Text(f"{result.model} · engine {result.engine} · {len(result.pairs)} pairs", style="dim"))
    parts.append(Text(result.what(), style="dim"))
    values, columns, _ = result.grid()
    grid = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold", padding=(0, 0, 0, 1))
    grid.add_column("", justify="right", no_wrap=True)
    for label in columns:
        grid.add_column(label, justify="center", no_wrap=True)
    for layer, line in enumerate(values):
        grid.add_row(f"L{layer}", *(_cell(float(v), color) for v in line))
    parts.append(grid)
    ranked = result.ranked(top)
    if ranked:
        table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
        table.add_column("rank", justify="right")
        table.add_column("head" if result.site == "z" else "patched", no_wrap=True)
        table.add_column("mean", justify="right")
        table.add_column(f"{result.level:.0%} interval", justify="right")
        table.add_column("pairs", justify="right")
        for k, (label, mean, low, high, count) in enumerate(ranked, 1):
            interval = "–" if not np.isfinite(low) else f"[{low:+.3f}, {high:+.3f}]".replace("-", "−")
            table.add_row(str(k), label, _cell(mean, color), interval, str(count))
        parts.append(Text(f"top {len(ranked)} by |mean effect|:", style="bold"))
        parts.append(table)
    for note in result.notes:
        parts.append(Text(note, style="dim"))
    return Group(*parts)


def versus_view(result: Versus, *, top: int = 10, color: bool = True) -> RenderableType:
    """Two checkpoints: the ``top`` heads by their largest change, each quantity's mean change
    (with its interval over pairs), and what each quantity is."""
    parts: list[RenderableType] = []
    if result.partial:
        parts.append(Text(f"PARTIAL: interrupted after {result.pairs} pairs", style="bold"))
    parts.append(Text(f"{result.model_b} − {result.model_a} · engine {result.engine}", style="dim"))
    parts.append(Text(result.what(), style="dim"))
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    table.add_column("rank", justify="right")
    table.add_column("head", no_wrap=True)
    first = result.quantities[0]
    for q in result.quantities:
        table.add_column(f"Δ{q}", justify="right")
        if q == first and result.pairs > 1:
            table.add_column(f"{result.level:.0%} interval", justify="right")
    ranked = result.ranked(top=top)
    for k, (layer, head, values) in enumerate(ranked, 1):
        cells = []
        for q in result.quantities:
            cells.append(f"{values[q]:+.3f}".replace("-", "−"))
            if q == first and result.pairs > 1:
                low, high = float(result.low[q][layer, head]), float(result.high[q][layer, head])
                cells.append(f"[{low:+.3f}, {high:+.3f}]".replace("-", "−") if np.isfinite(low) else "–")
        table.add_row(str(k), f"L{layer}.H{head}", *cells)
    parts.append(Text(f"top {len(ranked)} heads by |Δ{result.quantities[0]}|:", style="bold"))
    parts.append(table)
    for note in result.notes:
        parts.append(Text(note, style="dim"))
    return Group(*parts)
