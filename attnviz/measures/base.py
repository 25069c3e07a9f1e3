"""What a row shows: a measure is an object, not a name.

A ``Measure`` says what views print for it (``label``), whether its rows are distributions
(``sums_to_one``: colour scales, clipping, renormalising, rollout and means read it), which
taps of a head it records (``taps``, the names of ``attnviz.nn.taps``) and how it turns the
recorded taps into rows (``combine``). Every caller names a measure through
``measure_named`` and reads these properties; no module outside this one tests a measure's
name. A new measure is one more ``Measure`` here and one line in ``MEASURES``
(docs/development.md, "Add a measure"). Stdlib only: the CLI's ``--help`` imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import MeasureError, Reason


@dataclass(frozen=True)
class Measure:
    """One measure of a head's rows.

    name: what a caller passes (``measure="norm"``) and what JSON documents carry.
    label: what a view prints for a cell of raw rows ("weight", "norm ‖α·f(x)‖").
    share_label: what a view prints once rows that do not sum to one are shown as each
        row's shares (``transforms.shares``); the label itself for a distribution.
    sums_to_one: each row is a distribution over the keys (the weights α). False: rows are
        magnitudes (the norms), shown as shares, never renormalised, clipped or rolled out.
    taps: the taps it records per attention call (``attnviz.nn.taps`` names); beyond
        ``pattern``, each needs the engine to record the head's values and W^O.
    citation: where its formula comes from, printed beside figures.
    """

    name: str
    label: str
    share_label: str
    sums_to_one: bool
    taps: tuple[str, ...]
    citation: str = ""

    def __post_init__(self) -> None:
        if "pattern" not in self.taps:
            raise ValueError(f"measure {self.name!r}: every measure reads the pattern tap")

    @property
    def needs_values(self) -> bool:
        """Whether it records more than the weights (the values and W^O of each head), so
        the engines record the values and combine them (``measure=`` on the protocol)."""
        return self.taps != ("pattern",)

    def combine(self, pattern: Any, value_norms: Any = None) -> Any:
        """Rows from the recorded taps: ``pattern`` (B, H, Q, S) weights α, and for a
        measure with values the per-key norms ‖f_h(x_j)‖ (B, H, S) of ``v`` through each
        head's W^O block. Works on numpy arrays and torch tensors alike (broadcasting)."""
        if not self.needs_values:
            return pattern
        if value_norms is None:
            raise ValueError(f"measure {self.name!r} combines the pattern with value norms: none given")
        # ‖α_hij · f_h(x_j)‖ = α_hij · ‖f_h(x_j)‖, α ≥ 0 (Kobayashi et al. 2020, eq. 5).
        return pattern * value_norms[:, :, None, :]

    def as_dict(self) -> dict[str, Any]:
        """What a page's JSON carries: ``{name, label, sums_to_one}``."""
        return {
            "name": self.name,
            "label": self.label,
            "share_label": self.share_label,
            "sums_to_one": self.sums_to_one,
        }


WEIGHT = Measure(name="weight", label="weight", share_label="weight", sums_to_one=True, taps=("pattern",))
# Kobayashi et al. 2020, "Attention is Not Only a Weight": ‖α·f(x)‖, f(x) = x·W^V·W^O per head.
NORM = Measure(
    name="norm",
    label="norm ‖α·f(x)‖",
    share_label="norm share",
    sums_to_one=False,
    taps=("pattern", "v", "w_o"),
    citation="Kobayashi et al. 2020",
)

MEASURES: dict[str, Measure] = {m.name: m for m in (WEIGHT, NORM)}


def measure_named(name: str | Measure) -> Measure:
    """The measure called ``name`` (a ``Measure`` is returned as it is).

    Raises:
        MeasureError: an unknown name (a ``UsageError``; facts: reason "unknown_measure").
    """
    if isinstance(name, Measure):
        return name
    if name not in MEASURES:
        raise MeasureError(
            f"unknown measure {name!r} (known: {', '.join(MEASURES)})", reason=Reason.UNKNOWN_MEASURE, measure=name
        )
    return MEASURES[name]
