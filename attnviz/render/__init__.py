"""Renderers: data (an ``Attention``) in, terminal renderables, image files or an
interactive HTML page out."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def matplotlib_config_dir() -> None:
    """Point MPLCONFIGDIR at a private temp directory when matplotlib's own (under a
    read-only or missing HOME) cannot be written: matplotlib would then warn on stderr
    beside a successful export (issue 25). Runs before any render module imports it."""
    if os.environ.get("MPLCONFIGDIR"):
        return
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config") if "HOME" in os.environ else ""
    target = Path(base) / "matplotlib" if base else None
    probe = target
    try:
        while probe is not None and not probe.exists() and probe != probe.parent:
            probe = probe.parent
        usable = probe is not None and probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)
    except (OSError, ValueError):  # stat refused (a 5,000-character path, EACCES), a NUL in it
        usable = False
    if not usable:
        import tempfile

        # One directory per user, reused (matplotlib caches its font list there); a
        # fresh one when that name is taken by someone else or is a link.
        mine = Path(tempfile.gettempdir()) / f"attnviz-matplotlib-{os.getuid()}"
        try:
            mine.mkdir(mode=0o700, exist_ok=True)
            owned = not mine.is_symlink() and mine.stat().st_uid == os.getuid()
        except OSError:
            owned = False
        os.environ["MPLCONFIGDIR"] = str(mine) if owned else tempfile.mkdtemp(prefix="attnviz-matplotlib-")


matplotlib_config_dir()


def import_matplotlib_for_cli() -> None:
    """Import the matplotlib modules the image views use, without the ``set()`` docstrings.

    For the command line only, which never shows a docstring: each Artist subclass
    matplotlib defines builds a property table for its ``set()`` docstring (and
    ``%(Artist:kwdoc)s`` substitutions) at import time, ~0.15 s of the ~0.65 s that
    ``matplotlib.figure`` and ``matplotlib.axes`` take on this machine (issue 26). During
    the import ``matplotlib.artist.kwdoc`` returns "" (those docstrings stay short in this
    process) and is put back after; the drawn images are the same bytes
    (tests/test_export_speed.py). Does nothing when the axes are already imported (a
    notebook's pyplot) or matplotlib has no ``kwdoc``.
    """
    import sys

    if "matplotlib.axes" in sys.modules:
        return
    import matplotlib.artist as artist

    kwdoc = getattr(artist, "kwdoc", None)
    if not callable(kwdoc):
        return
    artist.kwdoc = lambda _artist: ""  # type: ignore[assignment]  # matplotlib calls it as a module global
    try:
        import matplotlib.axes
        import matplotlib.backends.backend_agg
        import matplotlib.figure  # noqa: F401
    finally:
        artist.kwdoc = kwdoc


# Here, not in render.image / render.html, so the CLI can check an output path and show its
# defaults without importing matplotlib or numpy.
IMAGE_FORMATS = (".png", ".svg", ".pdf")
HTML_FORMATS = (".html",)
EXPORT_FORMATS = IMAGE_FORMATS + HTML_FORMATS
DEFAULT_DPI = 150
DEFAULT_FONT_PT = 8.0  # tick labels; titles scale with it
EXPLAIN_TOP = 10  # explain's table: the top keys by default (a 343-token text printed 357 lines)
# explain's table orders (``--sort``): α, ‖f(x)‖, α·‖f(x)‖, or the top by α in text order
EXPLAIN_SORTS = ("weight", "norm", "contribution", "position")
COLUMN_IN = 6.3  # a one-layer figure fits this width (a paper's text column) by default


XLABELS = ("auto", "all", "none")


@dataclass(frozen=True)
class FigureStyle:
    """How an image is laid out, for papers (stdlib only, so the CLI can validate it).

    Attributes:
        figsize: (width, height) in inches: the figure is exactly that size and the cells
            shrink or grow to fit; None = computed from the data.
        fontsize: tick-label size in points (titles scale with it).
        heads: model head indices to draw (aggregate rows are always drawn); None = all.
        vmax: the top of the colour scale: a number in (0, 1], or "auto" (the largest
            weight drawn). The bottom is always 0.
        title: draw the sentence and provenance above the panels.
        cmap: a matplotlib colormap name (checked when drawing).
        xlabels: the token axis's labels: "auto" thins them so none overlap, always
            keeping the query, each drawn head's strongest key and the targets; "all"
            labels every column (they may touch); "none" draws none.
    """

    figsize: tuple[float, float] | None = None
    fontsize: float = DEFAULT_FONT_PT
    heads: tuple[int, ...] | None = None
    vmax: float | str = 1.0
    title: bool = True
    cmap: str = "viridis"
    xlabels: str = "auto"

    def __post_init__(self) -> None:
        if self.xlabels not in XLABELS:
            raise ValueError(f"xlabels {self.xlabels!r} is not one of {', '.join(XLABELS)}")
        if self.figsize is not None:
            w, h = self.figsize
            if not (0.5 <= w <= 100 and 0.5 <= h <= 100):
                raise ValueError(f"figure size {w} x {h} inches is out of range (0.5 to 100 each)")
        if not 3 <= self.fontsize <= 40:
            raise ValueError(f"font size {self.fontsize} pt is out of range (3 to 40)")
        if isinstance(self.vmax, str):
            if self.vmax != "auto":
                raise ValueError(f"vmax {self.vmax!r} is neither a number nor 'auto'")
        elif not 0 < self.vmax <= 1:
            raise ValueError(f"vmax {self.vmax} is out of range: attention weights lie in 0..1")
        if self.heads is not None and (not self.heads or min(self.heads) < 0):
            raise ValueError(f"heads {list(self.heads)}: give head indices from 0")


def parse_figsize(spec: str) -> tuple[float, float]:
    """'6.3x2.5' (or '6.3,2.5') -> (6.3, 2.5) inches.

    Raises:
        ValueError: not two positive numbers.
    """
    parts = spec.lower().replace("×", "x").replace(",", "x").split("x")
    try:
        w, h = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"cannot read figure size {spec!r}: give WIDTHxHEIGHT in inches, e.g. 6.3x2.5") from None
    return w, h


def parse_vmax(spec: str) -> float | str:
    """'auto' -> 'auto'; '0.5' -> 0.5."""
    if spec.strip().lower() == "auto":
        return "auto"
    try:
        return float(spec)
    except ValueError:
        raise ValueError(f"cannot read vmax {spec!r}: give a number in (0, 1] or auto") from None


# The largest HTML page `attnviz export -o view.html` writes. The page holds every weight of
# every kept layer and head (layers × heads × tokens², 2 bytes each, base64: 8/3 bytes), so
# 16 MB is e.g. MiniLM's 6 layers × 12 heads at 288 tokens, or one of its layers at 707 tokens.
# Past it a browser spends seconds parsing and the page is no longer something to mail.
HTML_BUDGET_BYTES = 16_000_000


def written_legend(tokens: Any) -> str | None:
    """The legend of every view of a generation (``Tokens.written_start``): '«…»: written by
    the model (--generate): tokens 15-18, after 15 given'; None when nothing was written."""
    start = tokens.written_start
    if start is None:
        return None
    end = len(tokens) - 1
    span = f"token {start}" if end == start else f"tokens {start}-{end}" if end > start else "no token"
    return f"«…»: written by the model (--generate): {span}, after {start} given"
