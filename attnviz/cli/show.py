"""attnviz show: head by head, where one token puts its attention."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app, errors
from .common import (
    budget,
    decoder_text,
    load,
    queries_from,
    read_input,
    sentence_tokens,
    stdout_console,
    view_from,
    wrote,
)
from .options import (
    DebugOpt,
    DeviceOpt,
    DType,
    DtypeOpt,
    EngineName,
    EngineOpt,
    FileOpt,
    HeadsOpt,
    HideSpecialOpt,
    IndexOpt,
    JsonOpt,
    LayerOpt,
    MaxMemoryOpt,
    ModelOpt,
    NoPagerOpt,
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


@app.command()
def show(
    sentence: TextArg = None,
    file: FileOpt = None,
    token: TokensOpt = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    all_tokens: Annotated[
        bool, typer.Option("--all-tokens", help="Every token's rows (the full matrices), for --json or --npz.")
    ] = False,
    model: ModelOpt = None,
    engine: EngineOpt = EngineName.own,
    layer: LayerOpt = "all",
    device: DeviceOpt = "auto",
    words: WordsOpt = False,
    hide_special: HideSpecialOpt = False,
    no_renorm: NoRenormOpt = False,
    heads: HeadsOpt = None,
    rollout: RolloutOpt = False,
    target_text: TargetTextOpt = None,
    target_file: TargetFileOpt = None,
    part: PartOpt = None,
    pair: PairOpt = None,
    values: Annotated[bool, typer.Option("--values", help="Print each weight in its cell.")] = False,
    json_out: JsonOpt = False,
    npz: Annotated[
        Path | None,
        typer.Option("--npz", metavar="PATH", help="Also write the weights and their provenance to an .npz file."),
    ] = None,
    png: Annotated[
        Path | None,
        typer.Option("--png", metavar="PATH", help="Also write the heatmaps to this PNG file.", show_default=False),
    ] = None,
    no_pager: NoPagerOpt = False,
    dtype: DtypeOpt = DType.float32,
    max_memory: MaxMemoryOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Show, head by head, where one token puts its attention.

    Ends with the strongest links that are not to special tokens, punctuation or the
    token's neighbours. A word split into pieces is one query: the mean of its pieces' rows.

    Example: attnviz show "The animal didn't cross the street because it was too tired" --token it

    Encoder-decoders: attnviz show SOURCE --target-text TARGET --part cross --token WORD
    shows where the decoder's WORD looks in the source.
    """
    with errors(debug):
        from ..errors import UsageError
        from ..pipeline import Selection, run
        from ..result import check_writable
        from .export import token_image

        # Before any model work: a typo should cost nothing.
        if png is not None:
            if png.suffix.lower() != ".png":
                raise UsageError(
                    f"--png writes PNG, but {str(png)!r} does not end in .png",
                    hint=f"for SVG or PDF use attnviz export ... -o {(png.stem or 'heads') + '.svg'}",
                )
            check_writable(png, (".png",))
        if npz is not None:
            check_writable(npz, (".npz",))
        if all_tokens:
            if token or index is not None:
                raise UsageError("--all-tokens reads every token", hint="drop --token/--index, or drop --all-tokens")
            if not (json_out or npz):
                raise UsageError("--all-tokens prints every row as data", hint="add --json or --npz PATH")
            if png is not None:
                raise UsageError("--png draws one token", hint="use attnviz export --view matrix for whole matrices")
        view, picked = view_from(words, hide_special, no_renorm, heads, rollout)
        queries = queries_from(token, occurrence, index, required=not all_tokens)
        selection = Selection(
            queries=tuple(queries), layers=layer, part=part.value if part else None, view=view, heads=picked
        )
        target = decoder_text(target_text, target_file)
        limit = budget(max_memory)
        text = read_input(sentence, file)
        eng = load(text, model, engine.value, device, dtype.value)
        # Every word found before the forward pass, on the part's query side.
        reading = run(sentence_tokens(eng, text, pair, target), eng, selection, target=target, max_memory=limit)
        att, positions = reading.attention, list(reading.queries)
        figure = None
        if png is not None:  # laid out and held to the pixel budget before any output
            from ..render import DEFAULT_DPI, FigureStyle

            try:
                figure = token_image(att, positions, DEFAULT_DPI, FigureStyle(heads=picked))
            except UsageError as exc:
                exc.facts.setdefault("command", "show")  # for the hint: show has no --dpi
                raise
        if npz is not None:
            att.save_npz(npz)
            wrote(npz)
        if json_out:
            if all_tokens:
                from .output import emit_json

                emit_json(att.to_dict())
            else:
                found = [att.query_dict(q) for q in positions]
                from .output import emit_json

                emit_json(found[0] if len(found) == 1 else found)
        elif not all_tokens:
            from ..render.terminal import for_console, paged, render_show

            console = stdout_console()
            with paged(console, not no_pager):
                console.print(render_show(att, positions, **for_console(console), values=values, heads=picked))
        if png is not None and figure is not None:
            from ..render import DEFAULT_DPI
            from ..render.image import save_figure

            save_figure(figure, png, DEFAULT_DPI)
            wrote(png)
