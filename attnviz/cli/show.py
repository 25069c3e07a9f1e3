"""attnviz show: head by head, where one token puts its attention."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from . import app, errors
from .common import decoder_text, load, query_from, sentence_tokens, stdout_console
from .options import (
    DebugOpt,
    DeviceOpt,
    EngineName,
    EngineOpt,
    IndexOpt,
    JsonOpt,
    LayerOpt,
    ModelOpt,
    Occurrence,
    PairOpt,
    PartOpt,
    Sentence,
    TargetFileOpt,
    TargetTextOpt,
    TokenOpt,
)


@app.command()
def show(
    sentence: Sentence,
    token: TokenOpt = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    model: ModelOpt = None,
    engine: EngineOpt = EngineName.own,
    layer: LayerOpt = "all",
    device: DeviceOpt = "auto",
    target_text: TargetTextOpt = None,
    target_file: TargetFileOpt = None,
    part: PartOpt = None,
    pair: PairOpt = None,
    values: Annotated[bool, typer.Option("--values", help="Print each weight in its cell.")] = False,
    json_out: JsonOpt = False,
    png: Annotated[
        Path | None,
        typer.Option("--png", metavar="PATH", help="Also write the heatmaps to this PNG file.", show_default=False),
    ] = None,
    debug: DebugOpt = False,
) -> None:
    """Show, head by head, where one token puts its attention.

    Example: attnviz show "The animal didn't cross the street because it was too tired" --token it

    Encoder-decoders: attnviz show SOURCE --target-text TARGET --part cross --token WORD
    shows where the decoder's WORD looks in the source.
    """
    with errors(debug):
        from ..engines import run
        from ..errors import UsageError
        from ..result import check_writable
        from ..select import Selection
        from .export import write_token_image

        if png is not None:
            # Before any model work: a typo in the path should cost nothing.
            if png.suffix.lower() != ".png":
                raise UsageError(
                    f"--png writes PNG, but {str(png)!r} does not end in .png",
                    hint=f"for SVG or PDF use attnviz export ... -o {png.with_suffix('.svg').name}",
                )
            check_writable(png, (".png",))
        query = query_from(token, occurrence, index)
        selection = Selection(query=query, layers=layer, part=part.value if part else None)
        target = decoder_text(target_text, target_file)
        eng = load(sentence, model, engine.value, device)
        text = sentence_tokens(eng, sentence, pair, target)
        att, resolved = run(text, eng, selection, target=target)
        if json_out:
            typer.echo(json.dumps(att.query_dict(resolved.queries), ensure_ascii=False))
        else:
            from ..render.terminal import render_show

            render_show(att, resolved.queries, stdout_console(), values=values)
        if png is not None:
            from ..render import DEFAULT_DPI

            write_token_image(att, resolved.queries, png, DEFAULT_DPI)
