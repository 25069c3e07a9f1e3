"""Two checkpoints of one architecture, head by head (the patch command's second model).

Base and fine-tuned, or two training steps: which heads changed what they do? On each
pair's clean prompt, at its scored position, every head of model A and of model B is read
four ways, and each head gets the change B − A:

    weight     ½ Σ_j |α^B_j − α^A_j|: the total variation distance between the head's two
               attention rows (0: the same row, 1: disjoint keys)
    norm       the same distance between its two norm-share rows, ‖α_j f(x_j)‖ / Σ_k
               (Kobayashi et al. 2020: what the head moves, not only where it looks)
    ablation   effect_B − effect_A: how much more removing the head changes B's final
               hidden state at the position (1 − cos, ``attnviz compare --ablate``)
    patching   effect_B − effect_A: the head's normalised patching effect (patching.py)

Over a file of pairs each change is averaged over the pairs, with the percentile bootstrap
interval of patchpairs.py; one pair gives the changes without an interval.
The two models must agree on the layers, the heads and the tokens of every prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Reason, UsageError
from .base import NORM, WEIGHT
from .patchpairs import LEVEL, RESAMPLES, bootstrap
from .patchresult import _numbers

QUANTITIES = ("patching", "ablation", WEIGHT.name, NORM.name)  # the two measures' row changes
SIGNED = ("patching", "ablation")  # B − A; the row distances are ≥ 0


def total_variation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """½ Σ |a − b| over the last axis: rows (..., S) of two distributions."""
    return 0.5 * np.abs(np.asarray(a, float) - np.asarray(b, float)).sum(-1)


def shares(rows: np.ndarray) -> np.ndarray:
    """Rows (..., S) of magnitudes as shares of their sum (a zero row stays zero)."""
    rows = np.asarray(rows, float)
    total = rows.sum(-1, keepdims=True)
    return np.divide(rows, total, out=np.zeros_like(rows), where=total > 0)


def check_same_shape(a: Any, b: Any, spec_a: str, spec_b: str) -> None:
    """Both models have the same layers and heads (``shape.ModelShape``s).

    Raises:
        UsageError: (reason "vs_model") they differ, naming both.
    """
    if (a.num_layers, a.num_heads) != (b.num_layers, b.num_heads):
        raise UsageError(
            f"{spec_a} has {a.num_layers} layers × {a.num_heads} heads and {spec_b} has "
            f"{b.num_layers} × {b.num_heads}: head by head needs one architecture",
            reason=Reason.VS_MODEL,
        )


@dataclass(frozen=True)
class Versus:
    """Every head's change from model A to model B.

    Attributes:
        model_a, model_b, engine: the two checkpoints and the engine.
        pairs: how many prompts (pairs) each change is over; partial: interrupted.
        per_pair: quantity -> (P, N, H) each pair's change (NaN where undefined).
        mean, low, high: quantity -> (N, H) the mean change and its bootstrap interval
            (NaN without one: a single pair).
        metric, direction: the patching metric and direction ("" without a corrupted prompt).
    """

    model_a: str
    model_b: str
    engine: str
    metric: str
    direction: str
    per_pair: dict[str, np.ndarray]
    mean: dict[str, np.ndarray]
    low: dict[str, np.ndarray]
    high: dict[str, np.ndarray]
    partial: bool = False
    resamples: int = RESAMPLES
    level: float = LEVEL
    notes: tuple[str, ...] = field(default=())

    @property
    def pairs(self) -> int:
        return int(next(iter(self.per_pair.values())).shape[0])

    @property
    def quantities(self) -> tuple[str, ...]:
        return tuple(q for q in QUANTITIES if q in self.mean)

    def ranked(self, by: str | None = None, top: int | None = None) -> list[tuple[int, int, dict[str, float]]]:
        """(layer, head, {quantity: mean change}) by |change| in ``by`` (default: patching
        when there is a corrupted prompt, else weight), largest first."""
        by = by or self.quantities[0]
        if by not in self.mean:
            raise UsageError(f"no {by!r} change here (there are: {', '.join(self.quantities)})", reason=Reason.VS_MODEL)
        values = self.mean[by]
        cells = [(n, h) for n in range(values.shape[0]) for h in range(values.shape[1]) if np.isfinite(values[n, h])]
        cells.sort(key=lambda c: (-abs(float(values[c])), c))
        out = [(n, h, {q: float(self.mean[q][n, h]) for q in self.quantities}) for n, h in cells]
        return out if top is None else out[:top]

    def what(self) -> str:
        told = {
            WEIGHT.name: f"{WEIGHT.name}: ½Σ|α_B − α_A| (the head's row, total variation)",
            NORM.name: f"{NORM.name}: the same over its {NORM.share_label}s",
            "ablation": "ablation: effect_B − effect_A (1 − cos of the final hidden state)",
            "patching": f"patching: effect_B − effect_A ({self.metric}, {self.direction})",
        }
        over = f"mean over {self.pairs} pairs, {self.level:.0%} bootstrap interval" if self.pairs > 1 else "one prompt"
        return (
            f"{self.model_b} − {self.model_a}, each head at the scored token; "
            + "; ".join(told[q] for q in self.quantities)
            + f"; {over}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "vs-model",
            "model_a": self.model_a,
            "model_b": self.model_b,
            "engine": self.engine,
            "metric": self.metric,
            "direction": self.direction,
            "label": self.what(),
            "pairs": self.pairs,
            "quantities": list(self.quantities),
            "mean": {q: _numbers(self.mean[q]) for q in self.quantities},
            "low": {q: _numbers(self.low[q]) for q in self.quantities},
            "high": {q: _numbers(self.high[q]) for q in self.quantities},
            "per_pair": {q: _numbers(self.per_pair[q]) for q in self.quantities},
            "resamples": self.resamples,
            "level": self.level,
            "partial": self.partial,
            "notes": list(self.notes),
        }

    def to_npz(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {"label": np.array(self.what())}
        for q in self.quantities:
            out[f"{q}_mean"], out[f"{q}_low"], out[f"{q}_high"] = self.mean[q], self.low[q], self.high[q]
            out[f"{q}_per_pair"] = self.per_pair[q]
        return out


def summarise(
    model_a: str,
    model_b: str,
    engine: str,
    per_pair: dict[str, list[np.ndarray]],
    metric: str = "",
    direction: str = "",
    partial: bool = False,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Versus:
    """The ``Versus`` of each pair's (N, H) changes (``per_pair[quantity]``, a list over pairs)."""
    stacked = {q: np.stack(v) for q, v in per_pair.items() if v}
    if not stacked:
        raise UsageError("no pair was compared before the interruption", reason=Reason.VS_MODEL)
    mean, low, high = {}, {}, {}
    for q, values in stacked.items():
        mean[q], low[q], high[q], _ = bootstrap(values, resamples, level, seed)
    return Versus(model_a, model_b, engine, metric, direction, stacked, mean, low, high, partial, resamples, level)
