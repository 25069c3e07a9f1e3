"""attnviz show: head by head, where one token puts its attention."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from . import app, errors
from .common import load, query_from, stdout_console
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
    Sentence,
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
        eng = load(sentence, model, engine.value, device)
        att, resolved = run(sentence, eng, Selection(query=query, layers=layer))
        if json_out:
            typer.echo(json.dumps(att.query_dict(resolved.queries), ensure_ascii=False))
        else:
            from ..render.terminal import render_show

            render_show(att, resolved.queries, stdout_console(), values=values)
        if png is not None:
            from ..render import DEFAULT_DPI

            write_token_image(att, resolved.queries, png, DEFAULT_DPI)
