"""The ``attnviz check`` table: per-layer max |Δ| of our weights against transformers'.

Takes a ``CheckResult`` (data), never a model. rich only; no torch, no typer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ...engines.support import Support
    from ...measures.check import CheckResult


def _cell(diff: float, tolerance: float) -> Text:
    ok = diff <= tolerance
    return Text(f"{diff:.2e}", style="green" if ok else "bold red")


def verdict(result: CheckResult) -> str:
    """The one-line conclusion, for the terminal and for logs."""
    if result.passed:
        what = f"all {result.shape.num_layers} layers"
        if result.shape.hybrid:
            what = f"the {len(result.shape.layers)} attention layers and the hidden states"
        if result.parts:
            what = "every layer of " + ", ".join(p.part for p in result.parts)
        return f"PASS: {what} within {result.tolerance:.0e} of transformers (worst |Δ| {result.worst:.1e})"
    return f"FAIL: {', '.join(result.failed)} over {result.tolerance:.0e} (worst |Δ| {result.worst:.1e})"


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
    if result.parts:
        # An encoder-decoder: one section per part, each with its stack's hidden states.
        setup += " (each sentence the source, the next one the decoder's text)"
        for p in result.parts:
            for layer, diff in enumerate(p.attention):
                table.add_row(
                    f"{p.part} {layer}", _cell(diff, result.tolerance), _status(diff, result.tolerance, "attention")
                )
            # Cross-attention lives in the decoder: its hidden states are the decoder's.
            if p.part == "encoder" or not any(q.part == "decoder" for q in result.parts) or p.part == "decoder":
                what = "encoder final" if p.part == "encoder" else "decoder final"
                table.add_row(what, _cell(p.hidden, result.tolerance), _status(p.hidden, result.tolerance, "hidden"))
            table.add_section()
    else:
        for layer, diff in zip(result.shape.layers, result.attention, strict=True):
            table.add_row(f"{layer}", _cell(diff, result.tolerance), _status(diff, result.tolerance, "attention"))
        table.add_section()
        table.add_row(
            "final", _cell(result.hidden, result.tolerance), _status(result.hidden, result.tolerance, "hidden")
        )
    line = Text(verdict(result), style="bold green" if result.passed else "bold red")
    return Group(header, *(Text(f"  {note}", style="dim") for note in (setup, *notes)), table, line)


def _status(diff: float, tolerance: float, what: str) -> str:
    return f"{what} ok" if diff <= tolerance else f"{what} OVER"


def render_support(rows: list[Support]) -> str:
    """``attnviz check --list``: one line per model type (engines that show it, and why
    not where neither does), then the counts. Plain text, for grep."""
    width = max(len(r.model_type) for r in rows) + 2
    shown = {"own": "own, hf", "hf": "hf", "none": "none"}
    lines = [f"{'model_type':<{width}}{'engines':<10}why not own / why not at all"]
    lines += [f"{r.model_type:<{width}}{shown[r.verdict]:<10}{r.why}".rstrip() for r in rows]
    counts = {v: sum(1 for r in rows if r.verdict == v) for v in shown}
    lines.append(
        f"{len(rows)} model types: {counts['own']} in the own engine (and hf), "
        f"{counts['hf']} in the hf engine only, {counts['none']} in neither"
    )
    return "\n".join(lines)
