"""attnviz export: per-head heatmaps as PNG, SVG or PDF files."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..render import (  # stdlib only: no matplotlib
    DEFAULT_DPI,
    DEFAULT_FONT_PT,
    EXPORT_FORMATS,
    HTML_FORMATS,
    FigureStyle,
    parse_figsize,
    parse_vmax,
)
from .app import EXAMPLE, app, errors
from .common import (
    budget,
    check_heads,
    decoder_text,
    load,
    need_text,
    query_from,
    read_input,
    sentence_tokens,
    view_from,
    wrote,
)
from .conventions import example
from .options import (
    DebugOpt,
    DeviceOpt,
    DType,
    DtypeOpt,
    EngineName,
    EngineOpt,
    ExportView,
    FileOpt,
    HeadsOpt,
    HideSpecialOpt,
    IndexOpt,
    LayersMeanOpt,
    MaxMemoryOpt,
    Measure,
    MeasureOpt,
    ModelOpt,
    NoRenormOpt,
    Occurrence,
    PairOpt,
    PartOpt,
    RolloutOpt,
    TargetFileOpt,
    TargetTextOpt,
    TextArg,
    TokenOpt,
    WordsOpt,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..engines import Engine
    from ..result import Attention
    from ..select import Query
    from ..tokens import Tokens

ViewOpt = Annotated[
    ExportView,
    typer.Option("--view", help="token: heads × tokens for one token, per layer; matrix: query × key per head."),
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


FigsizeOpt = Annotated[
    str | None,
    typer.Option(
        "--figsize", metavar="WxH", help="Figure size in inches, e.g. 6.3x2.5 (cells fit it).", show_default=False
    ),
]
FontsizeOpt = Annotated[float, typer.Option("--fontsize", metavar="PT", help="Label size in points.")]
VmaxOpt = Annotated[
    str, typer.Option("--vmax", metavar="auto|X", help="Top of the colour scale: a weight in (0, 1], or auto.")
]
CmapOpt = Annotated[str, typer.Option("--cmap", metavar="NAME", help="A matplotlib colormap, e.g. viridis, magma.")]
NoTitleOpt = Annotated[bool, typer.Option("--no-title", help="No sentence or provenance line above the panels.")]


@app.command(epilog=example(f'attnviz export "{EXAMPLE}" --token it -o it.png'))
def export(
    sentence: TextArg = None,
    file: FileOpt = None,
    *,
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
    view: ViewOpt = ExportView.token,
    layer: ImageLayerOpt = None,
    words: WordsOpt = False,
    hide_special: HideSpecialOpt = False,
    no_renorm: NoRenormOpt = False,
    heads: HeadsOpt = None,
    rollout: RolloutOpt = False,
    measure: MeasureOpt = Measure.weight,
    layers_mean: LayersMeanOpt = False,
    open_layer: Annotated[
        int | None,
        typer.Option(
            "--open-layer",
            metavar="N",
            min=0,
            help="HTML: the layer the page opens on [default: the layer of the token's strongest link that is "
            "not to a special token, punctuation or a neighbour, as show's footer finds it; else the middle one].",
            show_default=False,
        ),
    ] = None,
    figsize: FigsizeOpt = None,
    fontsize: FontsizeOpt = DEFAULT_FONT_PT,
    vmax: VmaxOpt = "1",
    cmap: CmapOpt = "viridis",
    no_title: NoTitleOpt = False,
    dpi: Annotated[
        int, typer.Option("--dpi", metavar="N", min=10, max=2400, help="Pixels per inch (PNG; images in SVG/PDF).")
    ] = DEFAULT_DPI,
    model: ModelOpt = None,
    engine: EngineOpt = EngineName.own,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = DType.float32,
    max_memory: MaxMemoryOpt = None,
    target_text: TargetTextOpt = None,
    target_file: TargetFileOpt = None,
    part: PartOpt = None,
    pair: PairOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Write per-head attention heatmaps to a PNG, SVG or PDF file, or an interactive HTML page.

    --view token (default) draws, for the chosen token, heads × tokens in each layer on one
    colour scale. --view matrix draws the full query × key matrix of each head of ONE layer
    (default: the middle layer); --token is optional there and outlines that token's row.
    PDFs embed TrueType fonts, SVGs keep text as text and are the same bytes on every run.

    -o view.html writes one self-contained page (it needs no network) holding every head of
    the chosen layers (default: all): head view, model view, matrix, and words / special
    tokens / head mean toggles. --token is optional and pins that token; --view matrix
    opens the matrix.
    """
    with errors(debug):
        from ..errors import UsageError
        from ..pipeline import Selection, choose_part, plan, read
        from ..result import check_writable
        from ..transforms import shares

        # Everything a user can get wrong without a model is checked before loading one
        # (and before importing matplotlib).
        need_text(sentence, file)
        check_writable(output, EXPORT_FORMATS)
        if view is ExportView.matrix and layer is not None and layer.strip().lower() == "all":
            raise UsageError("the matrix view draws one layer", hint="give --layer N (default: the middle layer)")
        query = query_from(token, occurrence, index, required=False)
        target = decoder_text(target_text, target_file)
        if open_layer is not None and output.suffix.lower() not in HTML_FORMATS:
            raise UsageError("--open-layer sets the layer an HTML page opens on", hint="write .html, or drop it")
        if output.suffix.lower() in HTML_FORMATS:
            if target is not None or part is not None:
                # The page's script draws square self-attention matrices over one text.
                raise UsageError(
                    "the HTML page shows self-attention over one text; encoder-decoder parts are not in it",
                    hint="drop --target-text/--part (the encoder), or export .png/.svg/.pdf",
                )
            # The page carries its own words / special tokens / head-mean toggles.
            text = read_input(sentence, file)
            eng = load(text, model, engine.value, device, dtype.value)
            first = sentence_tokens(eng, text, pair, None)
            tokens = eng.tokenize(first) if isinstance(first, str) else first
            write_page(eng, tokens, query, layer, view, output, budget(max_memory), measure.value, open_layer)
            return
        if view is ExportView.token and query is None:
            raise UsageError(
                "say which token to draw",
                hint="add --token WORD (or --index K), or use --view matrix for whole matrices",
            )
        reading, picked = view_from(words, hide_special, no_renorm, heads, rollout, measure.value, layers_mean)
        style = _style(figsize, fontsize, vmax, cmap, no_title, picked)
        limit = budget(max_memory)
        text = read_input(sentence, file)
        eng = load(text, model, engine.value, device, dtype.value)
        source = sentence_tokens(eng, text, pair, target)
        chosen = choose_part(eng, part.value if part else None, target is not None)
        shape = eng.part_shape(chosen)
        check_heads(picked, shape.num_heads)
        spec = layer if layer is not None or view is ExportView.token else str(shape.num_layers // 2)
        selection = Selection(
            queries=() if query is None else (query,),
            layers=spec,
            part=chosen,
            view=reading,
            heads=picked,
            all_rows=view is ExportView.matrix,  # the matrix: every query row, the token outlined
            measure=measure.value,
        )
        planned = plan(source, eng, selection, target=target)
        layers = planned.layers
        if view is ExportView.matrix and len(layers) != 1:
            raise UsageError(
                f"the matrix view draws one layer, not {len(layers)}",
                hint="give --layer N, or use --view token for several layers",
            )
        got = read(planned, eng, max_memory=limit)
        att = shares(got.attention)  # the norm measure's rows drawn as shares of 0..1
        if view is ExportView.token:
            write_token_image(att, got.queries[:1], output, dpi, style)
            return
        from ..render.image import matrix_figure, save_figure

        highlight = got.query_groups[0] if got.query_groups else ()
        missing = save_figure(matrix_figure(att, layers[0], highlight=highlight, style=style), output, dpi)
        wrote(output, missing)


def write_page(
    eng: Engine,
    tokens: Tokens,
    query: Query | None,
    layer: str | None,
    view: ExportView,
    path: Path,
    max_memory: int | None = None,
    measure: str = "weight",
    open_layer: int | None = None,
) -> None:
    """The interactive page: every query row of the chosen layers (default all), its size
    checked from the token count before the forward pass. ``measure`` "norm": the page
    carries the norms too and opens on them (a weight/norm toggle). It opens on
    ``open_layer``, by default the layer of the pinned token's strongest non-trivial link
    (``findings``)."""
    from ..errors import UsageError
    from ..findings import strongest_links
    from ..pipeline import Selection, plan, read
    from ..render.html import check_page_size, save_html

    selection = Selection(queries=() if query is None else (query,), layers=layer, all_rows=True)
    planned = plan(tokens, eng, selection)
    if open_layer is not None and open_layer not in planned.layers:
        kept = list(planned.layers)
        raise UsageError(
            f"--open-layer {open_layer} is not among the page's layers ({kept[0]}..{kept[-1]})"
            if kept == list(range(kept[0], kept[-1] + 1))
            else f"--open-layer {open_layer} is not among the page's layers {kept}",
            hint="pick one of them, or widen --layer",
        )
    heads = eng.shape.num_heads * (2 if measure == "norm" else 1)  # the norms double the matrices
    check_page_size(len(planned.layers), heads, len(tokens))
    got = read(planned, eng, max_memory)  # every query row: whole matrices
    norms = None
    if measure == "norm":
        norms = read(plan(tokens, eng, replace(selection, measure="norm")), eng, max_memory).attention
    pinned = got.queries[0] if query is not None else None  # a split word: its first piece
    att = got.attention
    if open_layer is None and pinned is not None:
        # The footer's rule (show): the strongest link not to specials, punctuation or neighbours,
        # from the pinned token's rows (its first piece, as the page pins it).
        found = strongest_links(att, att.query_slot(pinned), 1)
        open_layer = found[0].layer if found else None
    mode = "matrix" if view is ExportView.matrix else "head"
    save_html(att, path, query=pinned, view=mode, layer=open_layer, norms=norms)
    wrote(path)


def _style(
    figsize: str | None, fontsize: float, vmax: str, cmap: str, no_title: bool, heads: tuple[int, ...] | None
) -> FigureStyle:
    """The figure options as a ``FigureStyle``, checked before any model work."""
    from ..errors import UsageError

    try:
        size = parse_figsize(figsize) if figsize is not None else None
        return FigureStyle(
            figsize=size, fontsize=fontsize, heads=heads, vmax=parse_vmax(vmax), title=not no_title, cmap=cmap
        )
    except ValueError as exc:
        raise UsageError(str(exc), hint="see attnviz export --help for --figsize, --fontsize and --vmax") from None


def token_image(att: Attention, queries: Sequence[int], dpi: int, style: FigureStyle | None = None) -> Figure:
    """The token view of ``queries[0]`` (a split word: the mean of its pieces' rows),
    checked against the pixel budget at ``dpi`` (nothing is drawn yet)."""
    from ..render.image import check_pixels, token_figure

    if len(queries) > 1:
        # One figure per token would multiply files.
        sys.stderr.write(f"note: the image shows the first of {len(queries)} tokens; export the others one by one\n")
    fig = token_figure(att, queries[0], style=style)
    check_pixels(fig, dpi)
    return fig


def write_token_image(
    att: Attention, queries: Sequence[int], path: Path, dpi: int, style: FigureStyle | None = None
) -> None:
    """Write the token view of ``queries[0]`` to ``path``."""
    from ..render.image import save_figure

    missing = save_figure(token_image(att, queries, dpi, style), path, dpi)
    wrote(path, missing)
