"""``attnviz check``: the typer command, kept apart from cli.py, which registers it.

Thin: the comparison is ``attnviz.check.compare_engines``, the table is
``attnviz.render.check_table``. Library errors (attnviz.errors) propagate to the
CLI's error handler. Exit status: 0 when every difference is within tolerance, 1
when one is not.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer


def check(
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Checkpoint directory, Hub id or built-in name (default: the MiniLM)."),
    ] = None,
    sentence: Annotated[
        list[str] | None,
        typer.Option("--sentence", "-s", help="Also compare on this sentence (repeatable)."),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda, cuda:N or mps.")] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Prove that our multi-head attention is exact on a model: run --engine own and
    transformers on a few sentences and print, per layer, the largest difference of
    the attention weights (exit status 1 if any exceeds 1e-5)."""
    from rich.console import Console

    from .check import DEFAULT_SENTENCES, compare_engines

    sentences = (*DEFAULT_SENTENCES, *(sentence or ()))
    Console(stderr=True).print(
        f"[dim]comparing --engine own with transformers on {len(sentences)} sentences...[/dim]", highlight=False
    )
    result = compare_engines(model, sentences, device)
    if json_out:
        typer.echo(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        from .render.check_table import render_check

        Console(highlight=False).print(render_check(result))
    raise typer.Exit(0 if result.passed else 1)
