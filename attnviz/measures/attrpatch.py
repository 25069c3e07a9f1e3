"""Attribution patching: every head's patching effect estimated from one backward pass.

Activation patching (patching.py) runs the model once per head. Attribution patching
(Nanda 2023, "Attribution Patching: Activation Patching At Industrial Scale"; Kramár et
al. 2024, "AtP*") replaces each run by the first-order Taylor term of the metric m around
the run being patched. For a head h of layer l, with z_h its output before W^O (the tap
``blocks.l.attn.z``) at the matched positions p:

    denoise  m(corrupted run, z_h ← z_h^clean) − m(corrupted)
                 ≈ Σ_p (z_h^clean[p] − z_h^corrupted[p]) · ∂m/∂z_h[p]   at the corrupted run
    noise    m(clean run, z_h ← z_h^corrupted) − m(clean)
                 ≈ Σ_p (z_h^corrupted[p] − z_h^clean[p]) · ∂m/∂z_h[p]   at the clean run

One forward pass on each prompt and one backward pass give every head's estimate, at
every site at once. It is normalised as the exact effect is (0 = the corrupted run, 1 =
the clean one): effect ≈ (m(run) + estimate − m(corrupted)) / (m(clean) − m(corrupted)).

The gradient is the total derivative of m with respect to each layer's z: at each tap
the pass adds a zero tensor that requires grad (δ), so every later layer, and the path
through later heads, is in δ's gradient, and nothing upstream is cut off.

Where the estimate fails (Kramár et al. 2024, §3): it is exact for a metric linear in z
(no later non-linearity), and wrong where the model is far from linear between the two
runs: a later head's softmax that the patch moves from one key to another (saturated
attention: its slope at the run is near 0, so the move is invisible), the norms and MLPs,
and the metric's own curvature (prob, kl). Two cases are degenerate and refused: noising
with kl or hidden, whose gradient at the clean run is 0 (the clean run is their optimum).
``compare`` puts the estimate beside the exact effect and flags where they disagree.

torch + numpy; through the engine's taps alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Reason, UsageError
from .headsites import HEAD_SITES
from .patching import DIRECTIONS, SITES, PatchResult, run_fields, scored

if TYPE_CHECKING:
    import torch

    from ..engines import Engine
    from ..tokens import Tokens
    from .lm import LMHead
    from .patching import Metric

METHODS = ("exact", "attribution", "both")
# A disagreement: |exact − estimate| above this (in normalised effect), or opposite signs
# where both are at least SIGN_FLOOR in size.
THRESHOLD = 0.1
SIGN_FLOOR = 0.05
# A head whose weight on one key is at least this at the scored position is saturated.
SATURATED = 0.99

FAILS = (
    "the estimate is linear in each patched value: it misses what a patch does through later "
    "non-linearities: saturated attention (a later head's softmax moved from one key to "
    "another: its slope at the run is near 0), the norms and MLPs, and the metric's own "
    "curvature (prob, kl) (Kramár et al. 2024)"
)


def attribution_patch(
    engine: Engine,
    clean: Tokens,
    corrupted: Tokens,
    metric: Metric,
    *,
    position: int | None = None,
    direction: str = "denoise",
    layers: Sequence[int] | None = None,
    lm: LMHead | None = None,
    site: str = "z",
    by_position: bool = False,
) -> PatchResult:
    """Every head's (or layer's, for ``site``) attribution-patching estimate, as a
    ``PatchResult`` with ``method`` "attribution" (the same axes and normalisation as
    ``patching.patch_heads``; ``raw`` holds the estimated metric of each patched run,
    ``passes`` 2: the unpatched pass on the other prompt, and the pass with its backward).

    Raises:
        UsageError: what ``patch_heads`` refuses, and noising with the kl or hidden metric
            (their gradient at the clean run is 0: the estimate is blind there).
    """
    import torch

    from ..nn.taps import Taps, tap_name

    if direction not in DIRECTIONS:
        raise UsageError(
            f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})", reason=Reason.PATCH_METRIC
        )
    if site not in SITES:
        raise UsageError(f"unknown site {site!r} (known: {', '.join(SITES)})", reason=Reason.PATCH_METRIC)
    if site in HEAD_SITES:
        raise UsageError(
            f"attribution patching estimates z, resid_pre, attn_out and mlp_out; a head's {site} alone is "
            "patched exactly (method exact)",
            reason=Reason.PATCH_METRIC,
        )
    if direction == "noise" and metric.name in ("kl", "hidden"):
        raise UsageError(
            f"attribution patching cannot noise with the {metric.name} metric: its gradient at the clean run is 0 "
            "(the clean run is its optimum), so every estimate would be 1; use --direction denoise or --method exact",
            reason=Reason.PATCH_METRIC,
        )
    if engine.parts:
        raise UsageError(
            f"{engine.files.spec} is an encoder-decoder: patching reads one stack (its decoder is not done yet)",
            reason=Reason.PATCH_METRIC,
        )
    alignment, position, other = scored(engine, clean, corrupted, metric, lm, position)
    chosen = tuple(engine.shape.layers if layers is None else layers)
    n, h = engine.shape.num_layers, engine.shape.num_heads
    denoise = direction == "denoise"
    run, source = (corrupted, clean) if denoise else (clean, corrupted)
    at = other if denoise else position
    to_run = [b if denoise else a for a, b in alignment.pairs]
    from_source = [a if denoise else b for a, b in alignment.pairs]

    # 1. The other prompt's pass: its values at the site, and its final hidden state.
    record = Taps()
    for layer in chosen:
        record.record(tap_name(None, layer, site))
    with torch.inference_mode(), engine.tapping(record):
        source_hidden = engine.final_hidden(source)  # (1, Q', E)
    source_values = {layer: record[tap_name(None, layer, site)][0] for layer in chosen}  # (Q', ...)

    # 2. The run's pass with autograd: at each site a zero δ that requires grad is added,
    # so ∂m/∂δ is the total derivative of the metric with respect to the site's value.
    deltas: dict[int, torch.Tensor] = {}
    values: dict[int, torch.Tensor] = {}

    def add_delta(layer: int) -> Any:
        def add(value: torch.Tensor) -> torch.Tensor:
            values[layer] = value.detach()[0]
            delta = torch.zeros_like(value, requires_grad=True)
            deltas[layer] = delta
            return value + delta

        return add

    taps = Taps()
    for layer in chosen:
        taps.replace(tap_name(None, layer, site), add_delta(layer))
    if site == "z":  # which heads saturate at the scored position: where the estimate is least sure
        for layer in chosen:
            taps.record(tap_name(None, layer, "pattern"), positions=[at])
    with engine.tapping(taps):
        hidden = engine.final_hidden(run, grad=True)  # (1, Q, E)
        if denoise:
            clean_hidden, corrupted_hidden = source_hidden.detach(), hidden.detach()
        else:
            clean_hidden, corrupted_hidden = hidden.detach(), source_hidden.detach()
        anchor = clean_hidden[0, position]  # (E,)
        score = metric.score(hidden[:, at], anchor, lm)  # (1,)
        missing = [layer for layer in chosen if layer not in deltas]
        if missing:  # pragma: no cover - every engine taps every chosen layer
            raise RuntimeError(f"the {site} tap of layers {missing} was not reached")
        grads = torch.autograd.grad(score.sum(), [deltas[layer] for layer in chosen], allow_unused=True)
    with torch.inference_mode():
        clean_score = float(metric.score(clean_hidden[:, position], anchor, lm)[0])
        corrupted_score = float(metric.score(corrupted_hidden[:, other], anchor, lm)[0])
    run_score = corrupted_score if denoise else clean_score

    # 3. Each unit's estimate: (source − run) · gradient, summed over D (and the matched
    # positions, unless by_position).
    runs = torch.as_tensor(to_run, dtype=torch.long)
    sources = torch.as_tensor(from_source, dtype=torch.long)
    per_head = site == "z"
    shape = ((n, h) if per_head else (n,)) + ((len(to_run),) if by_position else ())
    estimate = np.full(shape, np.nan)
    for layer, grad in zip(chosen, grads, strict=True):
        g = torch.zeros_like(values[layer]) if grad is None else grad[0]  # (Q, H, Dv) or (Q, E)
        diff = source_values[layer][sources].double() - values[layer][runs].double()  # (P, ...)
        product = diff * g[runs].double()  # (P, H, Dv) or (P, E); Gemma 3n's streams: (P, A, E)
        terms = product.flatten(2 if per_head else 1).sum(-1)  # (P, H) or (P,)
        if per_head:
            terms = terms.T  # (H, P)
        estimate[layer] = (terms if by_position else terms.sum(-1)).cpu().numpy()
    denominator = clean_score - corrupted_score
    raw = run_score + estimate
    effect = (raw - corrupted_score) / denominator if denominator else np.full(shape, np.nan)
    notes = [FAILS]
    if not denominator:
        notes.append("the clean and corrupted runs score the same: the normalised effect is undefined (NaN)")
    if len(clean) != len(corrupted):
        notes.append(
            f"different lengths: {site} estimated at the {len(alignment.pairs)} matched positions; "
            f"{alignment.describe()}"
        )
    saturated = _saturated(taps, chosen, h) if site == "z" else ()
    if saturated:
        which = "corrupted" if denoise else "clean"
        notes.append(
            f"saturated at the scored position in the {which} run (one key ≥ {SATURATED}): "
            + ", ".join(saturated)
            + "; a patch that moves such a head's attention is where the estimate is least sure"
        )
    return PatchResult(
        **run_fields(engine, metric, clean, corrupted),
        site=site,
        direction=direction,
        effect=effect,
        raw=raw,
        clean_score=clean_score,
        corrupted_score=corrupted_score,
        position=position,
        corrupted_position=other,
        alignment=alignment,
        passes=2,
        notes=tuple(notes),
        axes=(("layer", "head") if per_head else ("layer",)) + (("position",) if by_position else ()),
        positions=tuple(a for a, _ in alignment.pairs) if by_position else (),
        method="attribution",
    )


def _saturated(taps: Any, layers: Sequence[int], heads: int) -> tuple[str, ...]:
    """'L3.H1' of each head whose largest weight at the scored position is ≥ SATURATED."""
    from ..nn.taps import tap_name

    found = []
    for layer in layers:
        name = tap_name(None, layer, "pattern")
        if name not in taps:
            continue
        top = taps[name][0, :, 0].amax(-1)  # (H,)
        found += [f"L{layer}.H{head}" for head in range(min(heads, top.numel())) if float(top[head]) >= SATURATED]
    return tuple(found)


# --- the estimate beside the exact effect ------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """The exact patching effect and its attribution-patching estimate, unit by unit.

    Attributes:
        exact, estimate: the two results (same axes, direction, metric, positions).
        threshold: a disagreement is |exact − estimate| above this, or opposite signs
            where both are at least ``sign_floor``.
    """

    exact: PatchResult
    estimate: PatchResult
    threshold: float = THRESHOLD
    sign_floor: float = SIGN_FLOOR

    def flags(self) -> np.ndarray:
        """An array of the effects' shape: "" (agree), "gap" or "sign"."""
        e, a = self.exact.effect, self.estimate.effect
        out = np.full(e.shape, "", dtype=object)
        finite = np.isfinite(e) & np.isfinite(a)
        flipped = finite & (np.sign(e) != np.sign(a)) & (np.abs(e) >= self.sign_floor) & (np.abs(a) >= self.sign_floor)
        out[finite & (np.abs(e - a) > self.threshold)] = "gap"
        out[flipped] = "sign"
        return out

    def rows(self, top: int | None = None) -> list[tuple[str, float, float, str]]:
        """(unit, exact, estimate, flag) by |exact|, largest first; NaN left out."""
        flags = self.flags()
        e, a = self.exact.effect, self.estimate.effect
        found = [
            (index, float(e[index]), float(a[index]), str(flags[index]))
            for index in np.ndindex(*e.shape)
            if np.isfinite(e[index]) and np.isfinite(a[index])
        ]
        found.sort(key=lambda r: (-abs(r[1]), r[0]))
        out = [(self.exact.unit_label(index), x, y, f) for index, x, y, f in found]
        return out if top is None else out[:top]

    def disagreements(self) -> list[tuple[str, float, float, str]]:
        """The flagged rows, by |exact − estimate|, largest first."""
        flagged = [row for row in self.rows() if row[3]]
        return sorted(flagged, key=lambda r: -abs(r[1] - r[2]))

    def correlation(self) -> float:
        """Pearson's r between the exact effects and the estimates (NaN if undefined)."""
        e, a = self.exact.effect.ravel(), self.estimate.effect.ravel()
        keep = np.isfinite(e) & np.isfinite(a)
        if keep.sum() < 2 or np.ptp(e[keep]) == 0 or np.ptp(a[keep]) == 0:
            return float("nan")
        return float(np.corrcoef(e[keep], a[keep])[0, 1])

    def to_dict(self) -> dict[str, Any]:
        """The --json document of ``--method both``."""
        from .patchresult import _numbers

        return {
            "kind": "patch-comparison",
            "exact": self.exact.to_dict(),
            "attribution": self.estimate.to_dict(),
            "difference": _numbers(self.estimate.effect - self.exact.effect),
            "threshold": self.threshold,
            "sign_floor": self.sign_floor,
            "correlation": None if not np.isfinite(self.correlation()) else self.correlation(),
            "disagreements": [
                {"unit": unit, "exact": x, "estimate": y, "flag": flag} for unit, x, y, flag in self.disagreements()
            ],
        }


def compare(exact: PatchResult, estimate: PatchResult, threshold: float = THRESHOLD) -> Comparison:
    """The two results side by side (they must patch the same units the same way)."""
    same = ("site", "direction", "metric", "axes", "position", "positions")
    for name in same:
        if getattr(exact, name) != getattr(estimate, name):
            raise ValueError(f"the results differ in {name}: {getattr(exact, name)!r} vs {getattr(estimate, name)!r}")
    return Comparison(exact, estimate, threshold)


def estimate_texts(
    engine: Engine,
    clean: str,
    corrupted: str,
    *,
    answer: str | None = None,
    wrong: str | None = None,
    metric: str | None = None,
    direction: str = "denoise",
    position: Any = None,
    layers: Sequence[int] | None = None,
    site: str = "z",
    by_position: bool = False,
) -> PatchResult:
    """``attribution_patch`` from two texts (as ``patching.patch_texts``)."""
    from .patching import prepare_texts

    if direction not in DIRECTIONS:
        raise UsageError(
            f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})", reason=Reason.PATCH_METRIC
        )
    a, b, m, at, lm = prepare_texts(engine, clean, corrupted, answer, wrong, metric, position)
    return attribution_patch(
        engine, a, b, m, position=at, direction=direction, layers=layers, lm=lm, site=site, by_position=by_position
    )


def patch_by(method: str, engine: Engine, clean: str, corrupted: str, **options: Any) -> PatchResult | Comparison:
    """``method`` "exact": the exact effects (``patching.patch_texts``); "attribution":
    their estimate (``estimate_texts``); "both": the two side by side (``compare``).
    ``options``: ``patch_texts``'s (``batch`` and ``progress`` go to the exact passes)."""
    if method not in METHODS:
        raise UsageError(f"unknown method {method!r} (known: {', '.join(METHODS)})", reason=Reason.PATCH_METRIC)
    from .patching import patch_texts

    if method == "exact":
        return patch_texts(engine, clean, corrupted, **options)
    estimated = {k: v for k, v in options.items() if k not in ("batch", "progress")}
    # The estimate first: its refusals (noising with kl) come before the exact passes.
    estimate = estimate_texts(engine, clean, corrupted, **estimated)
    if method == "attribution":
        return estimate
    return compare(patch_texts(engine, clean, corrupted, **options), estimate)
