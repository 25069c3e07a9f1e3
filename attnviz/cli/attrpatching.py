"""attnviz patch --method exact|attribution|both: which passes run, and what is written.

Apart from cli/patching.py so the command's body stays short: the
files (--npz, -o as an image or the HTML page) and the terminal view of either result.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import RenderableType

    from ..measures.attrpatch import Comparison
    from ..measures.patchresult import PatchResult


def save_files(result: PatchResult | Comparison, npz: Path | None, output: Path | None) -> tuple[str, ...]:
    """Write --npz and -o (.png/.svg/.pdf: the exact effects' heatmap, or the estimate's
    alone; .html: the page). Returns the fonts an image lacked (``save_figure``)."""
    from ..measures.attrpatch import Comparison

    exact = result.exact if isinstance(result, Comparison) else result
    if npz is not None:
        from ..measures.patching import save_npz

        extra = None
        if isinstance(result, Comparison):
            extra = {"estimate": result.estimate.effect, "estimate_raw": result.estimate.raw}
        save_npz(exact, npz, extra)
    if output is None:
        return ()
    if output.suffix.lower() in (".html", ".htm"):
        from ..render.html.patching import save_patch_page

        save_patch_page(result, output)
        return ()
    from ..render.image import save_figure
    from ..render.image.patching import patch_figure

    return save_figure(patch_figure(exact), output)


def view(result: PatchResult | Comparison, *, top: int, color: bool) -> RenderableType:
    """The terminal view of a result or a comparison."""
    from ..measures.attrpatch import Comparison

    if isinstance(result, Comparison):
        from ..render.terminal.attrpatch import comparison_view

        return comparison_view(result, top=top, color=color)
    from ..render.terminal.patching import patch_view

    return patch_view(result, top=top, color=color)
