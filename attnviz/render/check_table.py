"""The ``attnviz check`` table: per-layer max |Δ| of our weights against transformers'.

Takes a ``CheckResult`` (data), never a model. rich only; no torch, no typer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ..check import CheckResult


def _cell(diff: float, tolerance: float) -> Text:
    ok = diff <= tolerance
    return Text(f"{diff:.2e}", style="green" if ok else "bold red")


def verdict(result: CheckResult) -> str:
    """The one-line conclusion, for the terminal and for logs."""
    if result.passed:
        return (
            f"PASS: all {result.shape.num_layers} layers within {result.tolerance:.0e} of transformers "
            f"(worst |Δ| {result.worst:.1e})"
        )
    over = [f"layer {i}" for i in result.failed_layers]
    if result.hidden > result.tolerance:
        over.append("hidden states")
    return f"FAIL: {', '.join(over)} over {result.tolerance:.0e} (worst |Δ| {result.worst:.1e})"


def render_check(result: CheckResult) -> Group:
    """Header, the per-layer table, and the verdict line."""
    heads = f"{result.shape.num_heads} heads" + (
        f" over {result.shape.num_kv_heads} kv heads" if result.shape.num_kv_heads != result.shape.num_heads else ""
    )
    header = Text.assemble(
        ("attnviz check: ", "bold"), f"{result.model} ({result.model_type}, {result.shape.num_layers} layers, {heads})"
    )
    setup = f"{result.device}, float32, {len(result.sentences)} sentences, transformers eager attention"
    notes = result.shape.notes()
    table = Table()
    table.add_column("layer", justify="right")
    table.add_column("max |Δ| (own - hf)", justify="right")
    table.add_column("status")
    for layer, diff in enumerate(result.attention):
        table.add_row(f"{layer}", _cell(diff, result.tolerance), _status(diff, result.tolerance, "attention"))
    table.add_section()
    table.add_row("final", _cell(result.hidden, result.tolerance), _status(result.hidden, result.tolerance, "hidden"))
    line = Text(verdict(result), style="bold green" if result.passed else "bold red")
    return Group(header, *(Text(f"  {note}", style="dim") for note in (setup, *notes)), table, line)


def _status(diff: float, tolerance: float, what: str) -> str:
    return f"{what} ok" if diff <= tolerance else f"{what} OVER"
