"""Terminal view of ``attnviz heads --probe retrieval``: the heads ranked by retrieval score
(Wu et al. 2024) with their score at each length, and the best head's length × depth
heatmap. Data (a ``RetrievalReport``) in, a rich renderable out."""

from __future__ import annotations

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...measures.retrieval import RetrievalReport, described
from ...result import Provenance
from ...shape import head_label
from . import provenance_line
from .tables import _weight

RULE_NOTE = (
    "retrieval score (Wu et al. 2024): decoding steps whose strongest key lies in the needle and holds "
    "the token written, / needle tokens; mean over depths"
)


def _cell(value: float, color: bool) -> Text:
    return Text("-", style="dim") if np.isnan(value) else _weight(float(value), color=color)


def retrieval_view(report: RetrievalReport, p: Provenance, *, top: int = 5, color: bool = True) -> RenderableType:
    """The summary line, the ``top`` heads with their mean score and one column per length,
    the model's own recall of the needle per length, and the best head's heatmap."""
    parts: list[RenderableType] = []
    total = len(report.lengths) * len(report.depths)
    if report.partial:
        parts.append(Text(f"PARTIAL: interrupted; these scores cover {report.cases} of {total} cases", style="bold"))
    parts.append(Text(provenance_line(p), style="dim"))
    parts.append(
        Text(
            f"{report.cases} cases: {described(report.lengths)} tokens × {len(report.depths)} depths, "
            f"needle of {report.needle} tokens, {report.seconds:.1f} s",
            style="dim",
        )
    )
    per_length = report.per_length()  # (A, N, H)
    overall = report.overall()  # (N, H)
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for name in ("rank", "head", "score", *described(report.lengths).split(", ")):
        table.add_column(name, justify="left" if name == "head" else "right", no_wrap=True)
    ranked = report.ranking(top)
    for rank, (layer, h) in enumerate(ranked, 1):
        slot = report.layers.index(layer)
        label = f"L{layer} {head_label(h, p.num_heads, p.num_kv_heads)}"
        table.add_row(
            str(rank), label, _cell(overall[slot, h], color), *(_cell(v, color) for v in per_length[:, slot, h])
        )
    table.add_row("", Text("needle written", style="italic"), "", *(_cell(v, color) for v in report.recall()))
    parts.append(table)
    parts.append(Text(RULE_NOTE + "; 'needle written': the model's own recall of the needle", style="dim"))
    if ranked and report.cases:
        parts.append(heatmap(report, *ranked[0], p=p, color=color))
    return Group(*parts)


def heatmap(report: RetrievalReport, layer: int, head: int, *, p: Provenance, color: bool = True) -> RenderableType:
    """One head's retrieval score over lengths (rows) × needle depths (columns)."""
    grid = report.head_depths(layer, head)  # (A, B)
    title = Text(f"L{layer} {head_label(head, p.num_heads, p.num_kv_heads)}: retrieval score, length × depth")
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("length", justify="right")
    for depth in report.depths:
        table.add_column(f"{depth:g}", justify="right")
    for a, length in enumerate(described(report.lengths).split(", ")):
        table.add_row(length, *(_cell(v, color) for v in grid[a]))
    return Group(title, table)
