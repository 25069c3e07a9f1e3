"""What ``compare``, ``show`` and ``heads`` share for ``--ablate``: the options, the
checks before any model work, the progress bar, and the effects put on the rows."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .common import stderr_console

if TYPE_CHECKING:
    from ..measures.ablation import Effects
    from ..measures.metrics import HeadStats


class AblateWith(str, Enum):
    zero = "zero"
    mean = "mean"


AblateOpt = Annotated[
    bool,
    typer.Option(
        "--ablate",
        help="Remove each head in turn (its output before W^O) and add its effect on the token: "
        "1 − cos of the final hidden state (and kl, Δlogp with an LM head). One forward pass per layer.",
    ),
]
AblateWithOpt = Annotated[
    AblateWith,
    typer.Option(
        "--ablate-with",
        help="What replaces the removed head's output: zero, or its mean over the text's tokens.",
    ),
]

SHOW_AFTER = 1.0  # seconds before a progress bar appears


@contextmanager
def delayed_progress(label: str, quiet: bool) -> Iterator[Callable[[int, int], None]]:
    """A progress callback (done, total) that draws a bar on stderr once the work has taken
    more than a second (never when ``quiet``: --json, a pipe); gone when done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=stderr_console(),
        disable=quiet or not sys.stderr.isatty(),
        transient=True,
    )
    task = progress.add_task(label, total=None)
    started = time.perf_counter()
    shown = False

    def advance(done: int, total: int) -> None:
        nonlocal shown
        if not shown and time.perf_counter() - started > SHOW_AFTER:
            progress.start()
            shown = True
        progress.update(task, completed=done, total=total)

    try:
        yield advance
    finally:
        if shown:
            progress.stop()


def with_effects(rows: Sequence[HeadStats], effects: Effects, queries: Sequence[int]) -> list[HeadStats]:
    """``rows`` with each head's effect at the query (the mean over its tokens when the
    query word has several) and, with an LM head, its kl and delta_logprob."""

    effect = effects.effect[:, :, list(queries)].mean(-1)  # (N, H)
    out = []
    for row in rows:
        if row.aggregate:
            out.append(row)
            continue

        at = (row.layer, row.head)
        out.append(
            replace(
                row,
                effect=_known(effect, at),
                kl=_known(effects.kl, at),
                delta_logprob=_known(effects.delta_logprob, at),
            )
        )
    return out


def _known(values: Any, at: tuple[int, int]) -> float | None:
    """values[at] as a float; None for no array or NaN (a head not done)."""
    import numpy as np

    value = None if values is None else values[at]
    return None if value is None or np.isnan(value) else float(value)


def interrupted_note(effects: Effects) -> None:
    """One stderr line after the partial rows of an interrupted ablation."""
    import numpy as np

    done = int(np.isfinite(effects.effect[:, :, 0]).sum()) if effects.effect.size else 0
    sys.stderr.write(f"attnviz: interrupted: {done} heads ablated before Ctrl-C, the rest shown as – (partial)\n")
