"""attnviz export: per-head heatmaps as PNG, SVG or PDF files."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..render import DEFAULT_DPI, IMAGE_FORMATS  # constants only: no matplotlib
from . import app, errors
from .common import decoder_text, load, query_from, sentence_tokens, wrote
from .options import (
    DebugOpt,
    DeviceOpt,
    EngineName,
    EngineOpt,
    IndexOpt,
    ModelOpt,
    Occurrence,
    PairOpt,
    PartOpt,
    Sentence,
    TargetFileOpt,
    TargetTextOpt,
    TokenOpt,
    View,
)

if TYPE_CHECKING:
    from ..result import Attention

ViewOpt = Annotated[
    View, typer.Option("--view", help="token: heads × tokens for one token, per layer; matrix: query × key per head.")
]
ImageLayerOpt = Annotated[
    str | None,
    typer.Option(
        "--layer",
        "-l",
        metavar="LAYERS",
        help="Layer(s), 0-based: N, N,M, A-B or all [default: all for --view token; the middle layer for matrix].",
        show_default=False,
    ),
]


@app.command()
def export(
    sentence: Sentence,
    output: Annotated[
        Path,
        typer.Option("--output", "-o", metavar="PATH", help="Image file: .png, .svg or .pdf.", show_default=False),
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
    target_text: TargetTextOpt = None,
    target_file: TargetFileOpt = None,
    part: PartOpt = None,
    pair: PairOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Write per-head attention heatmaps to a PNG, SVG or PDF file.

    --view token (default) draws, for the chosen token, heads × tokens in each layer on one
    colour scale. --view matrix draws the full query × key matrix of each head of ONE layer
    (default: the middle layer); --token is optional there and outlines that token's row.

    Example: attnviz export "The animal didn't cross the street because it was too tired" --token it -o it.png
    """
    with errors(debug):
        from ..engines import choose_part, forward, plan
        from ..errors import UsageError
        from ..result import check_writable
        from ..select import Resolved, Selection

        # Everything a user can get wrong without a model is checked before loading one
        # (and before importing matplotlib).
        check_writable(output, IMAGE_FORMATS)
        if view is View.matrix and layer is not None and layer.strip().lower() == "all":
            raise UsageError("the matrix view draws one layer", hint="give --layer N (default: the middle layer)")
        query = query_from(token, occurrence, index, required=False)
        if view is View.token and query is None:
            raise UsageError(
                "say which token to draw",
                hint="add --token WORD (or --index K), or use --view matrix for whole matrices",
            )
        target = decoder_text(target_text, target_file)
        eng = load(sentence, model, engine.value, device)
        text = sentence_tokens(eng, sentence, pair, target)
        chosen_part = choose_part(eng, part.value if part else None, target is not None)
        default = str(eng.part_shape(chosen_part).num_layers // 2)
        layers = layer if layer is not None or view is View.token else default
        planned = plan(text, eng, Selection(query=query, layers=layers, part=chosen_part), target=target)
        resolved = planned.resolved
        if view is View.token:
            att = forward(planned.tokens, eng, resolved, target=planned.target, part=planned.part)
            write_token_image(att, resolved.queries, output, dpi)
            return
        if len(resolved.layers) != 1:
            raise UsageError(
                f"the matrix view draws one layer, not {len(resolved.layers)}",
                hint="give --layer N, or use --view token for several layers",
            )
        from ..render.image import matrix_figure, save_figure

        # Every query row: the whole matrix.
        att = forward(planned.tokens, eng, Resolved((), resolved.layers), target=planned.target, part=planned.part)
        save_figure(matrix_figure(att, resolved.layers[0], highlight=resolved.queries), output, dpi)
        wrote(output)


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
