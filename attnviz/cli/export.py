"""attnviz export: per-head heatmaps as PNG, SVG or PDF files, or the interactive HTML page."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..render import DEFAULT_DPI, EXPORT_FORMATS, HTML_FORMATS  # constants only: no matplotlib
from . import app, errors
from .common import load, query_from, wrote
from .options import (
    DebugOpt,
    DeviceOpt,
    EngineName,
    EngineOpt,
    IndexOpt,
    ModelOpt,
    Occurrence,
    Sentence,
    TokenOpt,
    View,
)

if TYPE_CHECKING:
    from ..engines import Engine
    from ..result import Attention
    from ..select import Query
    from ..tokens import Tokens

ViewOpt = Annotated[
    View, typer.Option("--view", help="token: heads × tokens for one token, per layer; matrix: query × key per head.")
]
ImageLayerOpt = Annotated[
    str | None,
    typer.Option(
        "--layer",
        "-l",
        metavar="LAYERS",
        help="Layer(s), 0-based: N, N,M, A-B or all "
        "[default: all for --view token and .html; the middle layer for matrix].",
        show_default=False,
    ),
]


@app.command()
def export(
    sentence: Sentence,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            metavar="PATH",
            help="Image file (.png, .svg, .pdf) or interactive page (.html).",
            show_default=False,
        ),
    ],
    token: TokenOpt = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    view: ViewOpt = View.token,
    layer: ImageLayerOpt = None,
    dpi: Annotated[
        int, typer.Option("--dpi", metavar="N", min=10, max=2400, help="Pixels per inch (PNG; images in SVG/PDF).")
    ] = DEFAULT_DPI,
    model: ModelOpt = None,
    engine: EngineOpt = EngineName.own,
    device: DeviceOpt = "auto",
    debug: DebugOpt = False,
) -> None:
    """Write per-head attention heatmaps to a PNG, SVG or PDF file, or an interactive HTML page.

    --view token (default) draws, for the chosen token, heads × tokens in each layer on one
    colour scale. --view matrix draws the full query × key matrix of each head of ONE layer
    (default: the middle layer); --token is optional there and outlines that token's row.

    -o view.html writes one self-contained page (it needs no network) holding every head of
    the chosen layers (default: all): head view, model view, matrix, and words / special
    tokens / head mean toggles. --token is optional and pins that token; --view matrix
    opens the matrix.

    Example: attnviz export "The animal didn't cross the street because it was too tired" --token it -o it.png
    """
    with errors(debug):
        from ..engines import forward
        from ..errors import UsageError
        from ..result import check_writable
        from ..select import Resolved, Selection

        # Everything a user can get wrong without a model is checked before loading one
        # (and before importing matplotlib).
        check_writable(output, EXPORT_FORMATS)
        if view is View.matrix and layer is not None and layer.strip().lower() == "all":
            raise UsageError("the matrix view draws one layer", hint="give --layer N (default: the middle layer)")
        query = query_from(token, occurrence, index, required=False)
        if output.suffix.lower() in HTML_FORMATS:
            eng = load(sentence, model, engine.value, device)
            write_page(eng, eng.tokenize(sentence), query, layer, view, output)
            return
        if view is View.token and query is None:
            raise UsageError(
                "say which token to draw",
                hint="add --token WORD (or --index K), or use --view matrix for whole matrices",
            )
        eng = load(sentence, model, engine.value, device)
        tokens = eng.tokenize(sentence)
        layers = layer if layer is not None or view is View.token else str(eng.num_layers // 2)
        resolved = Selection(query=query, layers=layers).resolve(tokens, eng.num_layers)
        if view is View.token:
            att = forward(tokens, eng, resolved)
            write_token_image(att, resolved.queries, output, dpi)
            return
        if len(resolved.layers) != 1:
            raise UsageError(
                f"the matrix view draws one layer, not {len(resolved.layers)}",
                hint="give --layer N, or use --view token for several layers",
            )
        from ..render.image import matrix_figure, save_figure

        att = forward(tokens, eng, Resolved((), resolved.layers))  # every query row: the whole matrix
        save_figure(matrix_figure(att, resolved.layers[0], highlight=resolved.queries), output, dpi)
        wrote(output)


def write_page(eng: Engine, tokens: Tokens, query: Query | None, layer: str | None, view: View, path: Path) -> None:
    """The interactive page: every query row of the chosen layers (default all), its size
    checked from the token count before the forward pass."""
    from ..engines import forward
    from ..render.html import check_page_size, save_html
    from ..select import Resolved, Selection

    resolved = Selection(query=query, layers=layer).resolve(tokens, eng.num_layers)
    check_page_size(len(resolved.layers), eng.shape.num_heads, len(tokens))
    att = forward(tokens, eng, Resolved((), resolved.layers))  # every query row: whole matrices
    pinned = resolved.queries[0] if resolved.queries else None  # a split word: its first piece
    save_html(att, path, query=pinned, view="matrix" if view is View.matrix else "head")
    wrote(path)


def write_token_image(att: Attention, queries: Sequence[int], path: Path, dpi: int) -> None:
    from ..render.image import save_figure, token_figure

    if len(queries) > 1:
        # One figure per token would multiply files; the first piece is the word's head.
        pieces = " + ".join(repr(att.tokens.labels[q]) for q in queries)
        sys.stderr.write(
            f"note: the word is split into {len(queries)} tokens ({pieces}); the image shows the first "
            "(use --index for another)\n"
        )
    save_figure(token_figure(att, queries[0]), path, dpi)
    wrote(path)
