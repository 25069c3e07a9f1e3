"""``attnviz patch --method both``'s terminal view: the exact patching effects (the heatmap
and ranked heads of ``patch_view``), then each top unit's attribution-patching estimate
beside its exact effect, the disagreements flagged, and where the estimate is known to fail.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...measures.attrpatch import Comparison
from .patching import _cell, patch_view

_FLAGS = {"": "", "gap": "✗ gap", "sign": "✗ sign"}


def comparison_view(comparison: Comparison, *, top: int = 10, color: bool = True) -> RenderableType:
    """patch_view of the exact effects, then the ``top`` units by |exact effect| with
    their estimates, and every disagreement beyond them."""
    exact, estimate = comparison.exact, comparison.estimate
    parts: list[RenderableType] = [patch_view(exact, top=top, color=color)]
    r = comparison.correlation()
    flagged = comparison.disagreements()
    parts.append(
        Text(
            "attribution patching beside it (Nanda 2023; Kramár et al. 2024): each unit's linear estimate "
            "from one forward pass on each prompt and one backward pass, normalised alike",
            style="bold",
        )
    )
    parts.append(
        Text(
            f"Pearson r (exact, estimate) = {r:.3f} over {len(comparison.rows())} units; "
            f"{len(flagged)} flagged: |exact − estimate| > {comparison.threshold:g} (gap) or opposite signs "
            f"both ≥ {comparison.sign_floor:g} (sign)",
            style="dim",
        )
    )
    shown = comparison.rows(top)
    names = {row[0] for row in shown}
    rest = [row for row in flagged if row[0] not in names]
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    table.add_column("rank", justify="right")
    table.add_column("unit", no_wrap=True)
    table.add_column("exact", justify="right")
    table.add_column("estimate", justify="right")
    table.add_column("est − exact", justify="right")
    table.add_column("flag", no_wrap=True)
    for k, (unit, x, y, flag) in enumerate(shown, 1):
        table.add_row(str(k), unit, _cell(x, color), _cell(y, color), f"{y - x:+.3f}", _FLAGS[flag])
    for unit, x, y, flag in rest:
        table.add_row("·", unit, _cell(x, color), _cell(y, color), f"{y - x:+.3f}", _FLAGS[flag])
    parts.append(table)
    for note in estimate.notes:
        parts.append(Text(note, style="dim"))
    return Group(*parts)
