"""Terminal view of ``attnviz heads``: the top heads of each detector, and coreference
accuracy beside its baseline. Data (a ``ScanReport``) in, a rich renderable out."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...corpus.detectors import top_heads
from ...corpus.scan import ScanReport
from ...measures.base import measure_named
from ...result import Provenance
from ...shape import head_label
from . import provenance_line
from .tables import _weight


def _head(layer: int, head: int, p: Provenance) -> str:
    return f"L{layer} {head_label(head, p.num_heads, p.num_kv_heads)}"


def summary_line(report: ScanReport, p: Provenance) -> str:
    """'all-MiniLM-L6-v2 · engine own · cpu · 6 layers × 12 heads · 2000 texts' (+ what was skipped)."""
    line = provenance_line(p)
    line += f" · {report.texts} texts in {report.seconds:.1f} s"
    if report.skipped:
        line += f" · {report.skipped} skipped (too long)"
    if report.truncated:
        line += f" · {report.truncated} truncated"
    return line


HEADS_NORM_NOTE = "measure norm: detectors read each row's norm shares ‖α·f(x)‖ / row sum (Kobayashi et al. 2020)"


def heads_table(
    report: ScanReport, p: Provenance, *, top: int = 3, color: bool = True, measure: str = "weight"
) -> RenderableType:
    """One line per detector: texts scored (n) and its ``top`` heads, mean ± sd over texts.
    Entropy lists the most focused (lowest) heads first."""
    parts: list[RenderableType] = []
    if report.partial:
        parts.append(Text(f"PARTIAL: interrupted; these scores cover the first {report.texts} texts", style="bold"))
    parts.append(Text(summary_line(report, p), style="dim"))
    if measure_named(measure).needs_values:
        parts.append(Text(HEADS_NORM_NOTE, style="dim"))
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    table.add_column("detector", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    ordinals = ["1st", "2nd", "3rd"] + [f"{k}th" for k in range(4, top + 1)]
    for k in range(top):
        table.add_column(ordinals[k], no_wrap=True)
    acc = report.heads
    for name in acc.detectors:
        n = int(acc.count[acc.detectors.index(name)])
        cells: list[Text | str] = [name + (" ▲" if name == "entropy" else ""), str(n)]
        if n == 0:
            cells += ["(no eligible text)"] + [""] * (top - 1)
        else:
            for row in top_heads(acc, name, top):
                cell = Text(_head(row.layer, row.head, p) + " ")
                cell.append_text(_weight(min(max(row.mean, 0.0), 1.0), color=color))
                cell.append(f"±{row.sd:.2f}", style="dim")
                cells.append(cell)
        table.add_row(*cells)
    parts.append(table)
    if acc.detectors != ("ablation",):
        parts.append(Text("mean ± sd over texts; ▲ lowest first (most focused)", style="dim"))
    if "ablation" in acc.detectors:
        parts.append(
            Text(
                "ablation: 1 − cos of the final hidden state when the head's output is removed before W^O; "
                "mean ± sd over tokens (n)",
                style="dim",
            )
        )
    if report.coref is not None and report.coref.total:
        parts.append(coref_table(report, p, top=top, color=color))
    return Group(*parts)


def coref_table(report: ScanReport, p: Provenance, *, top: int = 3, color: bool = True) -> RenderableType:
    """The ``top`` heads by coreference accuracy, and the nearest-candidate baseline."""
    tally = report.coref
    assert tally is not None  # the caller checks
    acc = tally.accuracy  # (N, H)
    order = sorted(
        ((float(acc[n, h]), layer, h) for n, layer in enumerate(tally.layers) for h in range(tally.num_heads)),
        key=lambda t: -t[0],
    )[:top]
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    table.add_column("coreference")
    table.add_column("accuracy", justify="right")
    for value, layer, h in order:
        table.add_row(_head(layer, h, p), _weight(value, color=color))
    table.add_row(Text("nearest candidate", style="italic"), f"{tally.baseline:.2f}")
    note = (
        f"{tally.total} examples: a head is right when the strongest non-special token the pronoun attends to "
        "is in the referent"
    )
    return Group(Text(""), table, Text(note, style="dim"))
