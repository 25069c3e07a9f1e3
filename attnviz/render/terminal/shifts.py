"""The summary ``attnviz compare --pairs`` ends with: one line per head, how its weight on
the referent changes across every pair of the file (``attnviz.measures.findings.HeadShift``)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...measures.findings import HeadShift


def shifts_table(shifts: Sequence[HeadShift], *, color: bool = True, title: str | None = None) -> RenderableType:
    """layer · head · mean change toward the referent · pairs that moved that way · interval."""
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    table.add_column("layer", justify="right")
    table.add_column("head", justify="right")
    table.add_column("toward referent", justify="right")
    table.add_column("pairs", justify="right")
    level = f"{round(shifts[0].level * 100)}% interval" if shifts else "interval"
    table.add_column(level, justify="left")
    for s in shifts:
        sign = "green" if s.mean > 0 else "red"
        table.add_row(
            str(s.layer),
            s.head,
            Text(f"{s.mean:+.2f}", style=sign if color else ""),
            f"{s.moved}/{s.pairs}",
            f"[{s.low:+.2f}, {s.high:+.2f}]",
        )
    parts: list[RenderableType] = [] if title is None else [Text(title, style="italic")]
    return Group(*parts, table)
