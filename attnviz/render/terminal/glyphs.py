"""The glyphs and the colour ramp every terminal view shares (the grid, the compact strip).

Colour is a perceptually uniform ramp (viridis) on an absolute 0..1 scale; without colour
(NO_COLOR, a pipe) cells fall back to shade glyphs.
"""

from __future__ import annotations

import numpy as np

# viridis at 9 stops (matplotlib's values), interpolated linearly between them.
_VIRIDIS = np.array(
    [
        (68, 1, 84),
        (71, 44, 122),
        (59, 81, 139),
        (44, 113, 142),
        (33, 144, 141),
        (39, 173, 129),
        (92, 200, 99),
        (170, 220, 50),
        (253, 231, 37),
    ],
    dtype=float,
)
_SHADES = " ·░▒▓█"
MARK = "◆"
MASKED = "-"  # not "·", which is a shade glyph
PAIR_RULE = "┃"  # between the two sentences of a pair


def colour(weight: float) -> str:
    """'#rrggbb' of ``weight`` (0..1) on the viridis ramp."""
    x = min(max(float(weight), 0.0), 1.0) * (len(_VIRIDIS) - 1)
    i = min(int(x), len(_VIRIDIS) - 2)
    r, g, b = _VIRIDIS[i] + (x - i) * (_VIRIDIS[i + 1] - _VIRIDIS[i])
    return f"#{round(r):02x}{round(g):02x}{round(b):02x}"


_HEX = [f"{v:02x}" for v in range(256)]


def colours(weights: np.ndarray) -> list[list[str]]:
    """``colour`` of each weight of ``weights`` (R, B) at once, as nested lists: the same
    operations in float64 and the same rounding (half to even), so the same strings."""
    x = np.clip(np.asarray(weights, dtype=np.float64), 0.0, 1.0) * (len(_VIRIDIS) - 1)
    i = np.minimum(x.astype(np.int64), len(_VIRIDIS) - 2)
    rgb = _VIRIDIS[i] + (x - i)[..., None] * (_VIRIDIS[i + 1] - _VIRIDIS[i])  # (R, B, 3)
    h = _HEX
    return [["#" + h[r] + h[g] + h[b] for r, g, b in row] for row in np.rint(rgb).astype(np.int64).tolist()]


def shade(weight: float) -> str:
    """A glyph for ``weight`` (0..1) when there is no colour: blank below 0.05,
    then · ░ ▒ ▓ █ in steps of 0.2."""
    if weight < 0.05:
        return " "
    return _SHADES[min(1 + int(weight * (len(_SHADES) - 1)), len(_SHADES) - 1)]
