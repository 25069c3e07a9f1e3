"""attnviz check: proof that our multi-head attention is exact on a model."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import ExitCode
from .app import app, errors
from .common import stderr_console, stdout_console
from .conventions import example
from .options import DebugOpt, DeviceOpt, JsonOpt, ModelOpt, Part


@app.command(epilog=example("attnviz check"))
def check(
    model: ModelOpt = None,
    sentence: Annotated[
        list[str] | None,
        typer.Option("--sentence", "-s", metavar="SENTENCE", help="Also compare on this sentence (repeatable)."),
    ] = None,
    device: DeviceOpt = "auto",
    part: Annotated[
        Part | None,
        typer.Option(
            "--part",
            help="Encoder-decoders: check only this part: encoder, decoder or cross [default: every part].",
            show_default=False,
        ),
    ] = None,
    list_types: Annotated[
        bool,
        typer.Option(
            "--list",
            help="List every model type transformers builds: which engine shows it (own, hf) or why neither does.",
        ),
    ] = False,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Prove our multi-head attention exact on a model: run it (the own engine) and
    transformers on a few sentences and print, per layer, the largest difference of the attention
    weights (exit status 1 if any exceeds 1e-5).

    Encoder-decoders: every part (encoder, decoder, cross-attention; each sentence the
    source, the next one the decoder's text), or the one --part names."""
    with errors(debug):
        from ..errors import UsageError

        if list_types:
            _list(json_out, model is not None or bool(sentence) or part is not None)
            return
        from ..measures.check import DEFAULT_SENTENCES, compare_engines

        for n, text in enumerate(sentence or (), start=1):  # before any model loads
            if not text.strip():
                raise UsageError(f"--sentence number {n} is empty", hint='give it some text, or drop -s ""')
        sentences = (*DEFAULT_SENTENCES, *(sentence or ()))
        err = stderr_console()
        if err.is_terminal:  # progress is for people watching, not for logs
            err.print(f"comparing --engine own with transformers on {len(sentences)} sentences...", style="dim")
        parts = None if part is None else (Part(part).value,)
        result = compare_engines(model, sentences, device, parts=parts)
        if json_out:
            from .output import emit_json

            # Every digit: the differences are ~1e-7, which six decimals would print as 0.0.
            emit_json(result.to_dict(), digits=None)
        else:
            from ..render.terminal.check import render_check

            stdout_console().print(render_check(result))
    raise typer.Exit(ExitCode.OK if result.passed else ExitCode.FAILURE)


def _list(json_out: bool, with_model: bool) -> None:
    """``--list``: the families table of ``engines.support``, read from the code's own
    tables (the own engine's registry, transformers' ``AutoModel`` mapping)."""
    from ..errors import UsageError

    if with_model:
        raise UsageError("--list lists every model type; it takes no --model, --sentence or --part")
    from ..engines.support import table, to_dict

    rows = table()
    if json_out:
        from .output import emit_json

        emit_json(to_dict(rows))
    else:
        from ..render.terminal.check import render_support
        from .output import emit

        emit(render_support(rows))
