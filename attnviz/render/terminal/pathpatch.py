"""``attnviz patch --receiver L.H``'s terminal view: path patching's effects, labelled with
the senders, the receivers, the input they were patched through, the direction and the
metric (the cells and scale of activation patching's view, render/terminal/patching.py).

Receivers view: layers × heads, each cell a sender head into the receivers together.
Pairs view (``--senders``): senders down, receivers across, each cell one path.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...measures.pathpatch import PathPatchResult
from .patching import _cell


def path_view(result: PathPatchResult, *, top: int = 10, color: bool = True) -> RenderableType:
    """The grid of effects, its scale, the clean and corrupted scores, the ``top`` paths."""
    parts: list[RenderableType] = []
    if result.partial:
        parts.append(Text("PARTIAL: interrupted; the paths not patched show –", style="bold"))
    parts.append(Text(f"{result.model} · engine {result.engine} · path patching", style="dim"))
    parts.append(Text(result.what(), style="dim"))
    parts.append(
        Text(
            f"clean {result.metric_label} = {result.clean_score + 0.0:.4g}; "
            f"corrupted = {result.corrupted_score + 0.0:.4g}; differing: {result.alignment.describe()}",
            style="dim",
        )
    )
    if result.view == "receivers":
        rows = [f"L{n}" for n in range(result.effect.shape[0])]
        columns = [f"H{h}" for h in range(result.effect.shape[1])]
        parts.append(Text("rows: the sender's layer; columns: its head", style="dim"))
    else:
        rows = [f"L{layer}.H{head}" for layer, head in result.senders]
        columns = [f"→L{layer}.H{head}" for layer, head in result.receivers]
        parts.append(Text(f"rows: senders; columns: receivers (through {result.through})", style="dim"))
    grid = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold", padding=(0, 0, 0, 1))
    grid.add_column("", justify="right", no_wrap=True)
    for label in columns:
        grid.add_column(label, justify="center", no_wrap=True)
    for row, line in zip(rows, result.effect):
        grid.add_row(row, *(_cell(float(v), color) for v in line))
    parts.append(grid)
    scale = Text("scale: ")
    for v in (-1.0, -0.5, 0.0, 0.5, 1.0):
        scale.append_text(_cell(v, color))
        scale.append(" ")
    scale.append(" effect (1 = the clean run's metric, 0 = the corrupted run's)", style="dim")
    parts.append(scale)
    ranked = result.ranked(top)
    if ranked:
        table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
        table.add_column("rank", justify="right")
        table.add_column("sender" if result.view == "receivers" else "path", no_wrap=True)
        table.add_column("effect", justify="right")
        table.add_column(result.metric_label, justify="right")
        for k, (label, value, raw) in enumerate(ranked, 1):
            table.add_row(str(k), label, _cell(value, color), f"{raw + 0.0:.4g}")
        noun = "senders" if result.view == "receivers" else "paths"
        parts.append(Text(f"top {len(ranked)} {noun} by |effect|:", style="bold"))
        parts.append(table)
    for note in result.notes:
        parts.append(Text(note, style="dim"))
    return Group(*parts)
