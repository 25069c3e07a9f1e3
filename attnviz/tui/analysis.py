"""The explorer's two analyses of the cursor's place: ``a`` (what removing each head of the
layer does at the query token, the heads ranked, as ``show --ablate`` measures it) and ``x``
(the head under the cursor explained step by step, as ``attnviz explain`` prints it).

tui/ computes neither: the CLI hands the app two callables (``attnviz.cli.exploring``:
``ablater``, ``explainer``) that run the model; this module says what they return and
draws it. numpy, rich and the terminal renderers only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
from rich.console import Group, RenderableType
from rich.text import Text

if TYPE_CHECKING:
    from ..measures.explain import Explanation
    from ..tokens import Tokens


class HeadEffects(Protocol):
    """What ``ablate`` returns (``attnviz.analyses.HeadAblation``): ``effect[n, h]`` is
    1 − cos of the final hidden state at the query with head h of layer ``layers[n]``
    removed; ``kl``/``delta_logprob`` the same shape with an LM head, else None."""

    @property
    def layers(self) -> tuple[int, ...]: ...
    @property
    def effect(self) -> np.ndarray: ...
    @property
    def kl(self) -> np.ndarray | None: ...
    @property
    def delta_logprob(self) -> np.ndarray | None: ...


# (tokens, raw query position) -> every kept layer's head effects at that token.
Ablate = Callable[["Tokens", int], HeadEffects]
# (tokens, raw query position, layer, head) -> the head's four steps for that token.
Explain = Callable[["Tokens", int, int, int], "Explanation"]

BAR = 24  # columns of the longest effect's bar

EFFECT_NOTE = (
    "effect: 1 − cos of the token's final hidden state with the head removed (its output before W^O set to "
    "zero), as attnviz show --ablate; one forward pass per batch of heads"
)


def ranked(effects: HeadEffects, layer: int) -> list[tuple[int, float]]:
    """The heads of ``layer`` with their effects, the largest first (a head not ablated,
    NaN, last)."""
    row = np.asarray(effects.effect[effects.layers.index(layer)], dtype=np.float64)
    order = sorted(range(len(row)), key=lambda h: (np.isnan(row[h]), -np.nan_to_num(row[h], nan=0.0), h))
    return [(h, float(row[h])) for h in order]


def ablation_view(effects: HeadEffects, layer: int, word: str, head: int | None, names: Sequence[str]) -> Text:
    """The ``a`` key's screen: the heads of ``layer`` ranked by what removing each does at
    the query ``word``, a bar each, the head under the cursor marked (``head``; None on the
    head mean). ``names``: the heads' names (``Attention.head_name``)."""
    n = effects.layers.index(layer)
    rows = ranked(effects, layer)
    top = max((e for _, e in rows if not np.isnan(e)), default=0.0) or 1.0
    text = Text(f"ablation at {word!r}, layer {layer}: the heads ranked by their effect\n", style="bold")
    width = max(len(names[h]) for h, _ in rows)
    for rank, (h, e) in enumerate(rows, 1):
        mark = "▸" if h == head else " "
        text.append(f"{mark}{rank:>3}. ")
        text.append(names[h].ljust(width), style="bold")
        if np.isnan(e):
            text.append("   –  (not ablated)\n")
            continue
        text.append(f"  {e:.4f}  ")
        text.append("█" * max(1, round(BAR * max(e, 0.0) / top)) if e > 0 else "", style="cyan")
        if effects.kl is not None:
            text.append(f"  KL {effects.kl[n, h]:.4f}")
        if effects.delta_logprob is not None:
            text.append(f"  Δlog p {effects.delta_logprob[n, h]:+.4f}")
        text.append("\n")
    text.append(EFFECT_NOTE + "\n", style="dim")
    text.append("Esc, or a key that moves or changes the view, goes back to it", style="dim")
    return text


def explain_screen(x: Explanation) -> RenderableType:
    """The ``x`` key's screen: ``attnviz explain``'s terminal view of the head (its steps,
    the top keys' table), then how to go back."""
    from ..render.terminal.explain import explain_view

    return Group(explain_view(x), Text("Esc, or a key that moves or changes the view, goes back to it", style="dim"))
