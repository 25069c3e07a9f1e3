"""attnviz export: per-head heatmaps as PNG, SVG or PDF files."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..render import (  # stdlib only: no matplotlib
    DEFAULT_DPI,
    DEFAULT_FONT_PT,
    EXPORT_FORMATS,
    HTML_FORMATS,
    FigureStyle,
    import_matplotlib_for_cli,
    parse_figsize,
    parse_vmax,
)
from .app import EXAMPLE, app, errors
from .common import check_heads, view_from, wrote
from .conventions import example
from .generating import SeedOpt
from .groups import Ablation, Generating, ModelChoice, Reading, TextInput, TextPair, grouped
from .options import DebugOpt, ExportView, Occurrence, TokensOpt
from .page import page_queries, page_toggles, write_page

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


OutputOpt = Annotated[
    Path,
    typer.Option(
        "--output",
        "-o",
        metavar="PATH",
        help="Image file (.png, .svg, .pdf) or interactive page (.html).",
        show_default=False,
    ),
]
OpenLayerOpt = Annotated[
    int | None,
    typer.Option(
        "--open-layer",
        metavar="N",
        min=0,
        help="HTML: the layer the page opens on [default: the layer of the token's strongest link that is "
        "not to a special token, punctuation or a neighbour, as show's footer finds it; else the middle one].",
        show_default=False,
    ),
]
DpiOpt = Annotated[
    int, typer.Option("--dpi", metavar="N", min=10, max=2400, help="Pixels per inch (PNG; images in SVG/PDF).")
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


class XLabels(str, Enum):
    """``--xlabels``: which token labels an image draws (render.FigureStyle.xlabels)."""

    auto = "auto"
    all = "all"
    none = "none"


XlabelsOpt = Annotated[
    XLabels,
    typer.Option(
        "--xlabels",
        help="Token labels: auto thins them so none overlap, always naming the token, each drawn head's "
        "strongest key and the --target words; all names every token; none names none.",
    ),
]
MarkOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--target",
        metavar="WORD[:N]",
        help="Image: a word whose label is always drawn (repeatable; WORD:N for the N-th occurrence).",
        show_default=False,
    ),
]
IndexesOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--index", "-i", metavar="K", help="Raw token position instead of --token (0-based); repeatable for .html."
    ),
]
RowsOpt = Annotated[
    bool,
    typer.Option(
        "--rows",
        help="HTML: row mode, the rows of the --token/--index tokens in every layer and head (no n × n matrices); "
        "the default when the full matrices would not fit the page's budget.",
    ),
]
MatrixLayerOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--matrix-layer",
        metavar="N",
        min=0,
        help="HTML row mode: also hold this layer's full matrices (repeatable; they grow as tokens²).",
        show_default=False,
    ),
]


@app.command(epilog=example(f'attnviz export "{EXAMPLE}" --token it -o it.png'))
@grouped(
    layout="sentence file output token occurrence index view layer words hide_special no_renorm heads rollout "
    "measure layers_mean ablate ablate_with generate sample temperature top_p seed open_layer rows matrix_layer "
    "figsize fontsize vmax cmap no_title xlabels mark dpi model engine device dtype max_memory target_text "
    "target_file part pair debug"
)
def export(
    *,
    text: TextInput,
    output: OutputOpt,
    token: TokensOpt = None,
    occurrence: Occurrence = None,
    index: IndexesOpt = None,
    view: ViewOpt = ExportView.token,
    layer: ImageLayerOpt = None,
    reading: Reading,
    ablation: Ablation,
    generation: Generating,
    seed: SeedOpt = None,
    open_layer: OpenLayerOpt = None,
    rows: RowsOpt = False,
    matrix_layer: MatrixLayerOpt = None,
    figsize: FigsizeOpt = None,
    fontsize: FontsizeOpt = DEFAULT_FONT_PT,
    vmax: VmaxOpt = "1",
    cmap: CmapOpt = "viridis",
    no_title: NoTitleOpt = False,
    xlabels: XlabelsOpt = XLabels.auto,
    mark: MarkOpt = None,
    dpi: DpiOpt = DEFAULT_DPI,
    model: ModelChoice,
    second: TextPair,
    debug: DebugOpt = False,
) -> None:
    """Write per-head attention heatmaps to a PNG, SVG or PDF file, or an interactive HTML page.

    --view token (default) draws, for the chosen token, heads × tokens in each layer on one
    colour scale. --view matrix draws the full query × key matrix of each head of ONE layer
    (default: the middle layer); --token is optional there and outlines that token's row.
    PDFs embed TrueType fonts, SVGs keep text as text and are the same bytes on every run.

    -o view.html writes one self-contained page (it needs no network) holding every head of
    the chosen layers (default: all): head view, model view, matrix, and words / special
    tokens / head mean toggles (--rollout adds the rollout, computed as show --rollout
    does, and opens on it; --measure norm the norms). --token is optional and pins that
    token; --view matrix opens the matrix. When the full matrices would not fit the page's budget (or with
    --rows), the page holds only the rows of the --token/--index tokens (repeatable) in
    every layer and head, computed without n × n matrices, and full matrices only for the
    --matrix-layer layers (with --measure norm, the norms' rows beside them).

    --generate N: the model first writes up to N tokens, and the file shows the prompt and
    what it wrote, the written tokens marked «like this»; the image's token (and the page's
    pinned one) is the first written token unless --token names one, and the page's rows
    are every written token's.
    """
    with errors(debug):
        from ..errors import UsageError
        from ..result import check_writable

        # Everything a user can get wrong without a model is checked before loading one
        # (and before importing matplotlib).
        text.need()
        check_writable(output, EXPORT_FORMATS)
        if view is ExportView.matrix and layer is not None and layer.strip().lower() == "all":
            raise UsageError("the matrix view draws one layer", hint="give --layer N (default: the middle layer)")
        queries = page_queries(token, occurrence, index)
        query = queries[0] if queries else None
        target = second.decoder_text()
        html = output.suffix.lower() in HTML_FORMATS
        _check(html, view, open_layer, rows, matrix_layer, ablation.ablate, target, queries, reading, xlabels, mark)
        sampling = generation.check(seed, target_text=target is not None)
        writing = (generation, sampling)
        if html:
            _page(
                writing,
                text,
                output,
                queries,
                view,
                layer,
                reading,
                ablation,
                open_layer,
                rows,
                matrix_layer,
                model,
                second,
                target,
            )
            return
        figure = {"figsize": figsize, "fontsize": fontsize, "vmax": vmax, "cmap": cmap, "no_title": no_title}
        figure["xlabels"] = xlabels.value
        _image(
            writing, text, output, query, view, layer, reading, figure, tuple(mark or ()), dpi, model, second, target
        )


def _image(
    writing: tuple[Generating, Any],
    text: TextInput,
    output: Path,
    query: Query | None,
    view: ExportView,
    layer: str | None,
    reading: Reading,
    figure: dict[str, Any],
    mark: tuple[str, ...],
    dpi: int,
    model: ModelChoice,
    second: TextPair,
    target: str | None,
) -> None:
    """The PNG, SVG or PDF: the token view of one token, or one layer's matrices."""
    from ..errors import UsageError
    from ..pipeline import Selection, choose_part, plan, read
    from ..transforms import shares

    generation, sampling = writing
    if view is ExportView.token and query is None and sampling is None:
        raise UsageError(
            "say which token to draw",
            hint="add --token WORD (or --index K), or use --view matrix for whole matrices",
        )
    reading_view, picked = reading.view()
    style = _style(**figure, heads=picked)
    limit = model.budget()
    sentence = text.read()
    eng = model.load(sentence)
    source = second.source(eng, sentence, target)
    chosen = choose_part(eng, second.part_name, target is not None or writes_target(eng, sampling))
    shape = eng.part_shape(chosen)
    check_heads(picked, shape.num_heads)
    spec = layer if layer is not None or view is ExportView.token else str(shape.layers[len(shape.layers) // 2])
    selection = Selection(
        queries=() if query is None else (query,),
        layers=spec,
        targets=mark,
        part=chosen,
        view=reading_view,
        heads=picked,
        all_rows=view is ExportView.matrix,  # the matrix: every query row, the token outlined
        measure=reading.measure_name,
    )
    source, written, selection, _ = generation.continued(eng, source, selection, sampling)
    planned = plan(source, eng, selection, target=written or target)
    layers = planned.layers
    if view is ExportView.matrix and len(layers) != 1:
        raise UsageError(
            f"the matrix view draws one layer, not {len(layers)}",
            hint="give --layer N, or use --view token for several layers",
        )
    got = read(planned, eng, max_memory=limit)
    att = shares(got.attention)  # the norm measure's rows drawn as shares of 0..1
    marked = tuple(p for positions in got.targets.values() for p in positions)
    if view is ExportView.token:
        write_token_image(att, got.queries[:1], output, dpi, style, marked)
        return
    import_matplotlib_for_cli()  # before render.image imports matplotlib the slow way
    from ..render.image import matrix_figure, save_figure

    highlight = got.query_groups[0] if got.query_groups else ()
    missing = save_figure(matrix_figure(att, layers[0], highlight=highlight, style=style), output, dpi)
    wrote(output, missing)


def _check(
    html: bool,
    view: ExportView,
    open_layer: int | None,
    rows: bool,
    matrix_layer: list[int] | None,
    ablate: bool,
    target: str | None,
    queries: list[Query],
    reading: Reading,
    xlabels: XLabels,
    mark: list[str] | None,
) -> None:
    """export's options against the output's kind and each other, before any model work."""
    from ..errors import UsageError
    from ..measures.base import measure_named

    if open_layer is not None and not html:
        raise UsageError("--open-layer sets the layer an HTML page opens on", hint="write .html, or drop it")
    if (rows or matrix_layer) and not html:
        flag = "--rows" if rows else "--matrix-layer"
        raise UsageError(f"{flag} is for the HTML page's row mode", hint="write .html, or drop it")
    if ablate and not html:
        raise UsageError(
            "--ablate draws each head's effect as a bar on the HTML page",
            hint="write -o view.html, or see the numbers with attnviz show --ablate",
        )
    if ablate and (rows or matrix_layer):
        raise UsageError(
            "the row-mode page does not carry the ablation bars",
            hint="drop --ablate, or drop --rows/--matrix-layer for the full page",
        )
    if ablate and target is not None:
        raise UsageError(
            "the page's ablation bars are for one text's self-attention",
            hint="drop --ablate, or see a decoder's effects with attnviz compare --ablate",
        )
    if html and (mark or xlabels is not XLabels.auto):
        raise UsageError(
            f"{'--target' if mark else '--xlabels'} sets an image's token labels; the page names every token",
            hint="write .png, .svg or .pdf, or drop it",
        )
    if mark and view is ExportView.matrix:
        raise UsageError("--target names keys in the token view's labels", hint="drop --target, or drop --view matrix")
    if len(queries) > 1 and not html:
        raise UsageError("an image draws one token", hint="give one --token/--index, or write .html for several")
    if html and matrix_layer and measure_named(reading.measure_name).needs_values:
        raise UsageError(
            "the row-mode page's matrix layers hold the attention weights only; the norm measure is in its rows",
            hint="drop --matrix-layer (the rows carry the chosen tokens' norms), or drop --measure norm",
        )
    if html and reading.rollout:
        view_from(False, False, False, None, reading.rollout, reading.measure_name)  # rollout with norms: refused
        if rows or matrix_layer:
            raise UsageError(
                "rollout multiplies every layer's full matrices; the row-mode page holds rows only",
                hint="drop --rollout, or drop --rows/--matrix-layer for the full page",
            )


def _page(
    writing: tuple[Generating, Any],
    text: TextInput,
    output: Path,
    queries: list[Query],
    view: ExportView,
    layer: str | None,
    reading: Reading,
    ablation: Ablation,
    open_layer: int | None,
    rows: bool,
    matrix_layer: list[int] | None,
    model: ModelChoice,
    second: TextPair,
    target: str | None,
) -> None:
    """The HTML page: it carries its own words / special tokens / head-mean toggles; the
    reading options set how it opens, and one it has no toggle for is refused here."""
    from ..errors import UsageError
    from ..pipeline import choose_part

    toggles = page_toggles(reading.words, reading.hide_special, reading.no_renorm, reading.heads, reading.layers_mean)
    sentence = text.read()
    eng = model.load(sentence)
    first: Tokens | str = second.source(eng, sentence, target)
    decoder: Tokens | str | None = target
    generation, sampling = writing
    if sampling is not None:
        from ..pipeline import Selection
        from ..select import Query

        first, decoder, _, gen = generation.continued(eng, first, Selection(), sampling)
        if gen is not None and not queries:  # every written token: the page's rows, the first one pinned
            queries = [Query(index=p) for p in gen.positions]
    chosen = choose_part(eng, second.part_name, decoder is not None)
    check_heads(toggles.shown, eng.part_shape(chosen).num_heads)
    if chosen == "cross" and not rows:
        # The full page's script draws square self-attention matrices over one text;
        # cross-attention is a row-mode page, of every decoder token unless --token
        # picks (a short text's rows are a few kilobytes; the page's budget refuses more).
        rows = True
        if not queries:
            from ..select import Query

            assert decoder is not None  # the cross part needs the decoder text
            count = len(eng.tokenize_target(decoder) if isinstance(decoder, str) else decoder)
            queries = [Query(None, None, i) for i in range(count)]
    if chosen == "cross" and matrix_layer:
        raise UsageError("cross-attention's page holds rows only", hint="drop --matrix-layer")
    tokens = eng.tokenize(first) if isinstance(first, str) else first
    write_page(
        eng,
        tokens,
        queries,
        layer,
        view,
        output,
        model.budget(),
        reading.measure_name,
        open_layer,
        rows=rows,
        matrix_layers=tuple(matrix_layer or ()),
        part=chosen,
        target=decoder if chosen in ("decoder", "cross") else None,
        ablate=ablation.mode,
        rollout=reading.rollout,
        toggles=toggles,
    )


def writes_target(eng: Engine, sampling: Any) -> bool:
    """Whether --generate writes a decoder text (an encoder-decoder): its part is then a decoder's."""
    return sampling is not None and bool(eng.parts)


def _style(
    figsize: str | None,
    fontsize: float,
    vmax: str,
    cmap: str,
    no_title: bool,
    heads: tuple[int, ...] | None,
    xlabels: str = "auto",
) -> FigureStyle:
    """The figure options as a ``FigureStyle``, checked before any model work."""
    from ..errors import UsageError

    try:
        size = parse_figsize(figsize) if figsize is not None else None
        return FigureStyle(
            figsize=size,
            fontsize=fontsize,
            heads=heads,
            vmax=parse_vmax(vmax),
            title=not no_title,
            cmap=cmap,
            xlabels=xlabels,
        )
    except ValueError as exc:
        raise UsageError(
            str(exc), hint="see attnviz export --help for --figsize, --fontsize, --vmax and --xlabels"
        ) from None


def token_image(
    att: Attention, queries: Sequence[int], dpi: int, style: FigureStyle | None = None, targets: Sequence[int] = ()
) -> Figure:
    """The token view of ``queries[0]`` (a split word: the mean of its pieces' rows),
    checked against the pixel budget at ``dpi`` (nothing is drawn yet)."""
    import_matplotlib_for_cli()  # before render.image imports matplotlib the slow way
    from ..render.image import check_pixels, token_figure

    if len(queries) > 1:
        # One figure per token would multiply files.
        sys.stderr.write(f"note: the image shows the first of {len(queries)} tokens; export the others one by one\n")
    fig = token_figure(att, queries[0], style=style, targets=targets)
    check_pixels(fig, dpi)
    return fig


def write_token_image(
    att: Attention,
    queries: Sequence[int],
    path: Path,
    dpi: int,
    style: FigureStyle | None = None,
    targets: Sequence[int] = (),
) -> None:
    """Write the token view of ``queries[0]`` to ``path`` (``targets``: key positions
    whose labels are always drawn)."""
    figure = token_image(att, queries, dpi, style, targets)  # first: it imports matplotlib the CLI's way
    from ..render.image import save_figure

    missing = save_figure(figure, path, dpi)
    wrote(path, missing)
