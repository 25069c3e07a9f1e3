"""What activation patching returns: ``PatchResult``, every unit's normalised effect with
its labels, its views' grid and its JSON document (patching.py computes it). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import headsites
from .alignment import Alignment


@dataclass(frozen=True)
class PatchResult:
    """Every head's patching effect on one pair of prompts.

    Attributes:
        model, engine: which model and engine ran it.
        site: what was patched ("z": each head's output before W^O).
        direction: "denoise" (corrupted run, clean z) or "noise" (clean run, corrupted z).
        metric: the metric's name; metric_label: what it computes.
        effect: (N, H) float64 normalised effects (0 = the corrupted run, 1 = the clean
            one); NaN where not computed (``partial``, a hybrid's layers without attention).
        raw: (N, H) float64 the metric of each patched run.
        clean_score, corrupted_score: the metric of the unpatched runs.
        position: the scored position in the clean prompt; corrupted_position: in the corrupted one.
        clean_tokens, corrupted_tokens: the two tokenizations' labels.
        alignment: how their positions match.
        passes: the forward passes the heads took (the unpatched runs not counted).
        partial: interrupted: only the finite effects were computed.
    """

    model: str
    engine: str
    site: str
    direction: str
    metric: str
    metric_label: str
    effect: np.ndarray
    raw: np.ndarray
    clean_score: float
    corrupted_score: float
    position: int
    corrupted_position: int
    clean_tokens: tuple[str, ...]
    corrupted_tokens: tuple[str, ...]
    alignment: Alignment
    passes: int
    partial: bool = False
    notes: tuple[str, ...] = field(default=())
    axes: tuple[str, ...] = ("layer", "head")
    positions: tuple[int, ...] = ()
    group: int = 1  # query heads per patched unit: H/G for k and v under grouped-query attention
    part: str | None = None  # an encoder-decoder's part patched (seq2seq_patch.py); None: one stack
    target_tokens: tuple[str, ...] = ()  # an encoder-decoder's decoder text, where the metric reads
    method: str = "exact"  # or "attribution": the linear estimate (attrpatch.py)

    @property
    def num_layers(self) -> int:
        return int(self.effect.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.effect.shape[1]) if "head" in self.axes else 0

    def grid(self) -> tuple[np.ndarray, list[str], str]:
        """What a layers × columns heatmap draws: (N, C) values, the column labels, and what
        a cell is. (N, H, P) effects are drawn at each head's position of largest |effect|."""
        head = "KV" if self.group > 1 else "H"
        if self.axes == ("layer", "head"):
            return self.effect, [f"{head}{h}" for h in range(self.num_heads)], "each head's effect"
        if self.axes == ("layer", "head", "position"):
            filled = np.where(np.isfinite(self.effect), self.effect, 0.0)
            pick = np.abs(filled).argmax(-1)[..., None]  # (N, H, 1)
            values = np.take_along_axis(self.effect, pick, -1)[..., 0]
            labels = [f"{head}{h}" for h in range(self.num_heads)]
            return values, labels, "each head's effect at its strongest position"
        if self.axes == ("layer", "position"):
            return self.effect, [self.clean_tokens[p] for p in self.positions], f"{self.site} at each position"
        return self.effect[:, None], [self.site], f"{self.site} at every matched position at once"

    def unit_label(self, index: tuple[int, ...]) -> str:
        """'L3.H1', 'L3.H1 @ it(10)', 'L3 resid_pre @ it(10)', 'L3 mlp_out' for an index of ``effect``."""
        named = dict(zip(self.axes, index, strict=True))
        head = f".KV{named['head']}" if self.group > 1 else f".H{named['head']}" if "head" in named else ""
        text = f"L{named['layer']}" + (head if "head" in named else f" {self.site}")
        if "position" in named:
            at = self.positions[named["position"]]
            text += f" @ {self.clean_tokens[at]}({at})"
        return text

    def ranked_units(self, top: int | None = None) -> list[tuple[str, float, float]]:
        """(label, effect, raw) of every unit by |effect|, largest first; NaN left out."""
        rows = [
            (index, float(self.effect[index]), float(self.raw[index]))
            for index in np.ndindex(*self.effect.shape)
            if np.isfinite(self.effect[index])
        ]
        rows.sort(key=lambda r: (-abs(r[1]), r[0]))
        out = [(self.unit_label(index), e, r) for index, e, r in rows]
        return out if top is None else out[:top]

    def what(self) -> str:
        """The label every view carries: what was patched, in which direction, by which metric."""
        arrow = (
            f"corrupted run ← clean {self.site}"
            if self.direction == "denoise"
            else f"clean run ← corrupted {self.site}"
        )
        what = {
            "z": "each head's z (output before W^O)",
            "resid_pre": "each layer's residual stream entering it (resid_pre)",
            "attn_out": "each layer's attention output (attn_out)",
            "mlp_out": "each layer's MLP output (mlp_out)",
        }.get(self.site) or headsites.describe(self.site, self.group, self.group * self.num_heads)
        where = " at each position apart" if "position" in self.axes else ""
        at = f"{self.clean_tokens[self.position]!r} (position {self.position})"
        if self.part is not None:
            what += {"encoder": " of the encoder", "decoder": " of the decoder", "cross": " of the cross-attention"}[
                self.part
            ]
            at = f"the decoder's {self.target_tokens[self.position]!r} (target position {self.position})"
        how = "patched" if self.method == "exact" else "estimated by attribution patching (linear, one backward pass)"
        return (
            f"{how}: {what}{where}, one at a time; {self.direction} ({arrow}); "
            f"metric: {self.metric} = {self.metric_label} at {at}; effect 0 = corrupted run, 1 = clean run"
        )

    def ranked(self, top: int | None = None) -> list[tuple[int, int, float, float]]:
        """(layer, head, effect, raw) by |effect|, largest first; NaN left out (the
        (layer, head) effects of site z; ``ranked_units`` for any site)."""
        if self.axes != ("layer", "head"):
            raise ValueError(f"ranked() reads (layer, head) effects; these are {self.axes}: use ranked_units()")
        rows = [
            (layer, head, float(self.effect[layer, head]), float(self.raw[layer, head]))
            for layer in range(self.num_layers)
            for head in range(self.num_heads)
            if np.isfinite(self.effect[layer, head])
        ]
        rows.sort(key=lambda r: (-abs(r[2]), r[0], r[1]))
        return rows if top is None else rows[:top]

    def to_dict(self) -> dict[str, Any]:
        """The --json document."""
        return {
            "kind": "patch",
            "method": self.method,
            "model": self.model,
            "engine": self.engine,
            "site": self.site,
            "direction": self.direction,
            "metric": self.metric,
            "metric_label": self.metric_label,
            "label": self.what(),
            **pair_fields(self),
            "layers": self.num_layers,
            "heads": self.num_heads,
            "axes": list(self.axes),
            "positions": list(self.positions),
            "group": self.group,
            "part": self.part,
            "target_tokens": list(self.target_tokens),
            **outcome_fields(self),
        }

    def to_npz(self) -> dict[str, np.ndarray]:
        """The arrays (and labels) for ``numpy.savez``."""
        return {
            "effect": self.effect,
            "raw": self.raw,
            "clean_tokens": np.array(self.clean_tokens),
            "corrupted_tokens": np.array(self.corrupted_tokens),
            "scores": np.array([self.clean_score, self.corrupted_score]),
            "label": np.array(self.what()),
        }


def _number(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def pair_fields(r: Any) -> dict[str, Any]:
    """The JSON fields every pair-patching result (``PatchResult``, pathpatch's
    ``PathPatchResult``) shares about its two runs: the scored positions, both prompts'
    labels, their alignment and their unpatched scores."""
    return {
        "position": r.position,
        "corrupted_position": r.corrupted_position,
        "clean_tokens": list(r.clean_tokens),
        "corrupted_tokens": list(r.corrupted_tokens),
        "alignment": r.alignment.to_dict(),
        "clean_score": r.clean_score,
        "corrupted_score": r.corrupted_score,
    }


def outcome_fields(r: Any) -> dict[str, Any]:
    """The JSON fields every pair-patching result ends on: the effects, the patched runs'
    metric, the passes taken, whether it was interrupted, and its notes."""
    return {
        "effect": _numbers(r.effect),
        "raw": _numbers(r.raw),
        "passes": r.passes,
        "partial": r.partial,
        "notes": list(r.notes),
    }


def _numbers(values: np.ndarray) -> Any:
    """Nested lists of an array, NaN as None."""
    if values.ndim == 0:
        return _number(float(values))
    return [_numbers(v) for v in values]
