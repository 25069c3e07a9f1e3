"""attnviz export: per-head heatmaps as PNG, SVG or PDF files."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..render import (  # stdlib only: no matplotlib
    DEFAULT_DPI,
    DEFAULT_FONT_PT,
    EXPORT_FORMATS,
    HTML_BUDGET_BYTES,
    HTML_FORMATS,
    FigureStyle,
    import_matplotlib_for_cli,
    parse_figsize,
    parse_vmax,
)
from .ablating import AblateOpt, AblateWith, AblateWithOpt
from .app import EXAMPLE, app, errors, hint_for
from .common import (
    budget,
    check_heads,
    decoder_text,
    load,
    need_text,
    queries_from,
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
    TokensOpt,
    WordsOpt,
)

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure

    from ..engines import Engine
    from ..pipeline import Plan
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
    token: TokensOpt = None,
    occurrence: Occurrence = None,
    index: IndexesOpt = None,
    view: ViewOpt = ExportView.token,
    layer: ImageLayerOpt = None,
    words: WordsOpt = False,
    hide_special: HideSpecialOpt = False,
    no_renorm: NoRenormOpt = False,
    heads: HeadsOpt = None,
    rollout: RolloutOpt = False,
    measure: MeasureOpt = Measure.weight,
    layers_mean: LayersMeanOpt = False,
    ablate: AblateOpt = False,
    ablate_with: AblateWithOpt = AblateWith.zero,
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
    rows: RowsOpt = False,
    matrix_layer: MatrixLayerOpt = None,
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
    tokens / head mean toggles (--rollout adds the rollout, computed as show --rollout
    does, and opens on it; --measure norm the norms). --token is optional and pins that
    token; --view matrix opens the matrix. When the full matrices would not fit the page's budget (or with
    --rows), the page holds only the rows of the --token/--index tokens (repeatable) in
    every layer and head, computed without n × n matrices, and full matrices only for the
    --matrix-layer layers (with --measure norm, the norms' rows beside them).
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
        queries = page_queries(token, occurrence, index)
        query = queries[0] if queries else None
        target = decoder_text(target_text, target_file)
        html = output.suffix.lower() in HTML_FORMATS
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
        if len(queries) > 1 and not html:
            raise UsageError("an image draws one token", hint="give one --token/--index, or write .html for several")
        if html and matrix_layer and measure is Measure.norm:
            raise UsageError(
                "the row-mode page's matrix layers hold the attention weights only; the norm measure is in its rows",
                hint="drop --matrix-layer (the rows carry the chosen tokens' norms), or drop --measure norm",
            )
        if html and rollout:
            view_from(False, False, False, None, rollout, measure.value)  # rollout with norms: refused
            if rows or matrix_layer:
                raise UsageError(
                    "rollout multiplies every layer's full matrices; the row-mode page holds rows only",
                    hint="drop --rollout, or drop --rows/--matrix-layer for the full page",
                )
        if html:
            # The page carries its own words / special tokens / head-mean toggles: the
            # reading options set how it opens; one it has no toggle for is refused here.
            toggles = page_toggles(words, hide_special, no_renorm, heads, layers_mean)
            text = read_input(sentence, file)
            eng = load(text, model, engine.value, device, dtype.value)
            chosen = choose_part(eng, part.value if part else None, target is not None)
            if chosen == "cross" and not rows:
                # The full page's script draws square self-attention matrices over one text.
                raise UsageError(
                    "the full HTML page draws self-attention over one text; cross-attention is in row mode only",
                    hint="add --rows with --token (the decoder text's tokens), or give --part encoder or decoder",
                )
            if chosen == "cross" and matrix_layer:
                raise UsageError("cross-attention's page holds rows only", hint="drop --matrix-layer")
            first = sentence_tokens(eng, text, pair, target)
            tokens = eng.tokenize(first) if isinstance(first, str) else first
            write_page(
                eng,
                tokens,
                queries,
                layer,
                view,
                output,
                budget(max_memory),
                measure.value,
                open_layer,
                rows=rows,
                matrix_layers=tuple(matrix_layer or ()),
                part=chosen,
                target=target if chosen in ("decoder", "cross") else None,
                ablate=ablate_with.value if ablate else None,
                rollout=rollout,
                toggles=toggles,
            )
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
        import_matplotlib_for_cli()  # before render.image imports matplotlib the slow way
        from ..render.image import matrix_figure, save_figure

        highlight = got.query_groups[0] if got.query_groups else ()
        missing = save_figure(matrix_figure(att, layers[0], highlight=highlight, style=style), output, dpi)
        wrote(output, missing)


def page_queries(tokens: list[str] | None, occurrence: int | None, indexes: list[int] | None) -> list[Query]:
    """The queries of repeatable --token WORD[:N] and --index K, checked before any model work."""
    from ..errors import UsageError
    from ..select import Query

    picked = list(indexes or [])
    if len(picked) <= 1:
        return queries_from(tokens, occurrence, picked[0] if picked else None, required=False)
    if tokens:
        raise UsageError("give --token or --index, not both", hint="--token WORD picks by text, --index K by position")
    if occurrence is not None:
        raise UsageError("--occurrence is for one --token", hint="with --index, give the positions themselves")
    return [Query(index=k) for k in picked]


@dataclass(frozen=True)
class PageToggles:
    """The reading toggles an HTML page (full or row mode) opens with."""

    words: bool = False
    hide_special: bool = False
    mean: bool = False


def page_toggles(words: bool, hide_special: bool, no_renorm: bool, heads: str | None, layers_mean: bool) -> PageToggles:
    """The reading options as the toggles the page opens with (``--words``,
    ``--hide-special``, ``--heads mean``), checked before any model work: one the page has
    no toggle for is a usage error, not an option silently dropped."""
    from ..errors import UsageError
    from ..transforms import parse_heads

    if no_renorm:
        raise UsageError(
            "the page renormalises each row when it sets special tokens aside; it has no --no-renorm",
            hint="drop --no-renorm, or see the raw rows with attnviz show --hide-special --no-renorm",
        )
    if layers_mean:
        raise UsageError(
            "the page draws each layer; it has no mean over the layers",
            hint="drop --layers-mean, or see it with attnviz show --layers-mean",
        )
    try:
        picked, kinds = parse_heads(heads)
    except ValueError as exc:
        raise UsageError(str(exc), hint="the page takes --heads mean (its head-mean toggle)") from None
    if picked is not None:
        raise UsageError(
            "the page holds every head, shown and hidden by its head buttons",
            hint="drop the head numbers from --heads, or draw just those heads to an image: -o heads.png",
        )
    if "max" in kinds:
        raise UsageError(
            "the page has a head-mean toggle, not a head max",
            hint="use --heads mean, or see the max with attnviz show --heads max",
        )
    return PageToggles(words=words, hide_special=hide_special, mean="mean" in kinds)


def write_page(
    eng: Engine,
    tokens: Tokens,
    queries: Sequence[Query],
    layer: str | None,
    view: ExportView,
    path: Path,
    max_memory: int | None = None,
    measure: str = "weight",
    open_layer: int | None = None,
    *,
    rows: bool = False,
    matrix_layers: Sequence[int] = (),
    part: str | None = None,
    target: str | None = None,
    ablate: str | None = None,
    rollout: bool = False,
    toggles: PageToggles | None = None,
) -> None:
    """The interactive page: every query row of the chosen layers (default all), its size
    checked from the token count before the forward pass. ``measure`` "norm": the page
    carries the norms too and opens on them (a weight/norm toggle). It opens on
    ``open_layer``, by default the layer of the pinned token's strongest non-trivial link
    (``findings``). ``ablate`` ("zero" or "mean"): each head of the page's layers removed
    in turn, its effect at every token carried for the page's bars (full page only).
    ``rollout``: the page carries the rollout (``transforms.rollout``, through every layer
    from 0 as ``show --rollout`` computes it, whichever layers the page keeps) and opens
    with its toggle on (full page only: it needs every layer's full matrices). ``toggles``:
    the words, special-tokens and head-mean toggles it opens with (``page_toggles``).

    Row mode (``rows``, ``matrix_layers``, or full matrices over the budget with a query
    given): ``write_row_page``. An encoder-decoder's ``part`` "encoder" (the source) or
    "decoder" (the self-attention of ``target``, the decoder text)."""
    from ..errors import UsageError
    from ..findings import strongest_links
    from ..pipeline import Selection, plan, read
    from ..render.html import Options, PageAblation, ablation_bytes, check_page_size, save_html
    from ..transforms import View

    selection = Selection(queries=tuple(queries), layers=layer, all_rows=True, part=part)
    planned = plan(tokens, eng, selection, target=target)
    shown = planned.query_tokens  # the decoder text for the decoder part
    if open_layer is not None and open_layer not in planned.layers:
        kept = list(planned.layers)
        raise UsageError(
            f"--open-layer {open_layer} is not among the page's layers ({kept[0]}..{kept[-1]})"
            if kept == list(range(kept[0], kept[-1] + 1))
            else f"--open-layer {open_layer} is not among the page's layers {kept}",
            hint="pick one of them, or widen --layer",
        )
    heads = eng.part_shape(planned.part).num_heads * (2 if measure == "norm" else 1)  # norms: twice the matrices
    heads += 1 if rollout else 0  # the rollout: one matrix more per layer
    fallback = False
    extra = 0 if ablate is None else ablation_bytes(len(planned.layers), eng.shape.num_heads, len(shown))
    if not (rows or matrix_layers):
        try:
            check_page_size(len(planned.layers), heads, len(shown), HTML_BUDGET_BYTES - extra)
        except UsageError as exc:
            if ablate is not None:  # the row-mode page carries no ablation bars
                raise
            if not planned.queries:
                raise UsageError(
                    exc.message,
                    hint=f"{hint_for(exc)}, or give --token WORD (or --index K) for a row-mode page: that token's "
                    "rows in every layer and head",
                ) from None
            if rollout:  # rollout needs every layer's full matrices
                raise
            rows = fallback = True
    toggles = toggles or PageToggles()
    if rows or matrix_layers:
        write_row_page(eng, planned, view, path, max_memory, measure, open_layer, matrix_layers, fallback, toggles)
        return
    rolled = None
    if rollout:
        # The CLI's own path (show --rollout): every row of layers 0..max(layers), rolled
        # out, the page's layers picked; its last slot is the rollout.
        with_rollout = plan(tokens, eng, replace(selection, view=View(rollout=True)), target=target)
        got = read(with_rollout, eng, max_memory)
        both = got.attention
        rolled = both.weights[:, both.model_heads]  # (N, S, S)
        heads_only = replace(both, weights=both.weights[:, : both.model_heads], aggregates=(), steps=())
        got = replace(got, attention=heads_only)
    else:
        got = read(planned, eng, max_memory)  # every query row: whole matrices
    norms = None
    if measure == "norm":
        norms = read(plan(tokens, eng, replace(selection, measure="norm"), target=target), eng, max_memory).attention
    query = queries[0] if queries else None
    pinned = got.queries[0] if query is not None else None  # a split word: its first piece
    att = got.attention
    if open_layer is None and pinned is not None:
        # The footer's rule (show): the strongest link not to specials, punctuation or neighbours,
        # from the pinned token's rows (its first piece, as the page pins it).
        found = strongest_links(att, att.query_slot(pinned), 1)
        open_layer = found[0].layer if found else None
    effects = None
    if ablate is not None:
        effects = PageAblation(_page_effects(eng, planned, att.layers, max_memory, ablate), ablate)
    mode = "matrix" if view is ExportView.matrix else "head"
    options = Options(words=toggles.words, hide_special=toggles.hide_special, mean=toggles.mean, rollout=rollout)
    save_html(
        att,
        path,
        query=pinned,
        view=mode,
        layer=open_layer,
        norms=norms,
        ablation=effects,
        rollout=rolled,
        options=options,
    )
    wrote(path)


def _page_effects(eng: Engine, planned: Plan, layers: Sequence[int], max_memory: int | None, mode: str) -> np.ndarray:
    """(N_kept, H, S): the effect of removing each head of the page's layers at every token
    (the same passes give every position's final hidden state). Ctrl-C writes no page."""
    from ..ablation import Runner, ablate_text, batch_size
    from ..engines import cpu_threads_for
    from .ablating import delayed_progress

    runner = Runner(eng, planned.tokens)
    batch = batch_size(eng, len(planned.tokens), max_memory)
    with delayed_progress("ablating", False) as progress, cpu_threads_for(eng, len(planned.tokens) * batch):
        found = ablate_text(runner, mode, batch, layers, progress=progress)
    if found.partial:
        raise KeyboardInterrupt
    return found.effect[list(layers)]  # (N, H, S), in the page's layer order


def write_row_page(
    eng: Engine,
    planned: Plan,
    view: ExportView,
    path: Path,
    max_memory: int | None,
    measure: str,
    open_layer: int | None,
    matrix_layers: Sequence[int],
    fallback: bool = False,
    toggles: PageToggles | None = None,
) -> None:
    """The row-mode page: the rows of the planned queries (every piece of their words) in
    every planned layer and head, by the row path (no n × n matrix), plus the full
    matrices of ``matrix_layers``. Every size is checked before the forward pass.
    ``fallback``: the full page was too large (said on stderr once the rows fit)."""
    from ..errors import UsageError
    from ..findings import strongest_links
    from ..pipeline import forward
    from ..render.html_rows import RowPage, check_row_page, row_positions, save_html

    if measure == "norm" and matrix_layers:
        raise UsageError(
            "the row-mode page's matrix layers hold the attention weights only; the norm measure is in its rows",
            hint="drop --matrix-layer (the rows carry the chosen tokens' norms), or drop --measure norm",
        )
    if not planned.queries:
        raise UsageError(
            "a row-mode page holds the rows of chosen query tokens: say which",
            hint="add --token WORD or --index K (both repeatable)",
        )
    layers, tokens, shown = planned.layers, planned.tokens, planned.query_tokens
    heads = eng.part_shape(planned.part).num_heads
    stored_heads = heads * (2 if measure == "norm" else 1)  # the norms: as many rows again
    extra = sorted(set(matrix_layers))
    missing = [m for m in extra if m not in layers]
    if missing:
        raise UsageError(
            f"--matrix-layer {missing[0]} is not among the page's layers ({', '.join(map(str, layers))})"
            if len(layers) < 12
            else f"--matrix-layer {missing[0]} is not among the page's layers",
            hint="pick one of them, or widen --layer",
        )
    if open_layer is None and view is ExportView.matrix and extra:
        open_layer = extra[0]
    positions = row_positions(shown, [p for g in planned.queries for p in g])
    keys = len(tokens) if planned.part == "cross" else len(shown)  # cross-attention: over the source
    check_row_page(
        len(layers), stored_heads, len(positions), keys, len(extra), HTML_BUDGET_BYTES - cross_labels(planned)
    )
    if fallback:
        sys.stderr.write(
            f"note: {len(shown)} tokens' full matrices do not fit the page: it holds the rows of the chosen "
            "tokens (row mode; --matrix-layer N adds a layer's matrices)\n"
        )
    target, part = planned.target, planned.part
    att = forward(tokens, eng, layers, positions, max_memory, target=target, part=part)  # asked rows: no n × n
    matrix = forward(tokens, eng, extra, (), max_memory, target=target, part=part) if extra else None
    norms = None
    if measure == "norm":  # the same rows times the value norms (H, S) of each layer: no n × n either
        norms = forward(tokens, eng, layers, positions, max_memory, target=target, part=part, measure="norm")
    pinned = planned.queries[0][0]
    if open_layer is None:
        found = strongest_links(att, att.query_slot(pinned), 1)  # show's footer rule
        open_layer = found[0].layer if found else None
    t = toggles or PageToggles()
    opens = RowPage(
        query=pinned,
        view="matrix" if view is ExportView.matrix else "head",
        layer=open_layer,
        words=t.words,
        hide_special=t.hide_special,
        mean=t.mean,
    )
    size, stored = save_html(att, path, matrix, opens, HTML_BUDGET_BYTES - cross_labels(planned), norms)
    norm_note = (
        ""
        if norms is None
        else f"; norms beside them, largest error {stored['norm_max_error']:.2g} "
        f"({stored['norm_share_error']:.2g} in the shares shown)"
    )
    sys.stderr.write(
        f"note: row mode, {len(positions)} query row(s) × {len(layers)} layers × {heads} heads × "
        f"{keys} keys as {'uint' + str(stored['bits'])}: {size / 1e6:.1f} MB, largest error "
        f"{stored['max_error']:.2g}{norm_note}\n"
    )
    wrote(path)


def cross_labels(planned: Plan) -> int:
    """Bytes a cross-attention page spends on the decoder text's labels beside the source's
    (the size estimate counts the keys' tokens): budgeted as generously as those."""
    from ..render.html import PER_TOKEN_BYTES

    return PER_TOKEN_BYTES * len(planned.query_tokens) if planned.part == "cross" else 0


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
    import_matplotlib_for_cli()  # before render.image imports matplotlib the slow way
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
    figure = token_image(att, queries, dpi, style)  # first: it imports matplotlib the CLI's way
    from ..render.image import save_figure

    missing = save_figure(figure, path, dpi)
    wrote(path, missing)
