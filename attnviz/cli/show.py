"""attnviz show: head by head, where one token puts its attention."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .ablating import AblateOpt, AblateWith, AblateWithOpt
from .app import EXAMPLE, app, errors
from .common import (
    budget,
    decoder_text,
    load,
    need_text,
    queries_from,
    read_input,
    sentence_tokens,
    stdout_console,
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
    FileOpt,
    HeadsOpt,
    HideSpecialOpt,
    IndexOpt,
    JsonOpt,
    LayerOpt,
    LayersMeanOpt,
    MaxMemoryOpt,
    Measure,
    MeasureOpt,
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

if TYPE_CHECKING:
    from ..result import Attention

FULL_LIMIT = 100_000  # lines --full may print


@app.command(epilog=example(f'attnviz show "{EXAMPLE}" --token it'))
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
    layers_mean: LayersMeanOpt = False,
    target_text: TargetTextOpt = None,
    target_file: TargetFileOpt = None,
    part: PartOpt = None,
    pair: PairOpt = None,
    measure: MeasureOpt = Measure.weight,
    values: Annotated[bool, typer.Option("--values", help="Print each weight in its cell.")] = False,
    ablate: AblateOpt = False,
    ablate_with: AblateWithOpt = AblateWith.zero,
    full: Annotated[
        bool, typer.Option("--full", help="The full grid even when a row wraps into more than two blocks.")
    ] = False,
    top_keys: Annotated[
        int | None,
        typer.Option(
            "--top-keys",
            metavar="K",
            min=1,
            help="Compact view: how many strongest keys each head line names [default: 2 at 80 columns, 3 wider].",
            show_default=False,
        ),
    ] = None,
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

    Encoder-decoders: attnviz show SOURCE --target-text TARGET --part cross --token WORD
    shows where the decoder's WORD looks in the source.
    """
    with errors(debug):
        from ..errors import UsageError
        from ..pipeline import Selection, plan, read
        from ..result import check_writable
        from ..transforms import shares
        from .export import token_image

        # Before any model work: a typo should cost nothing.
        need_text(sentence, file)
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
        if ablate and all_tokens:
            raise UsageError("--ablate measures one token's heads", hint="drop --all-tokens, and name a --token")
        if ablate and rollout:
            raise UsageError("rollout's rows are not heads: there is nothing to ablate", hint="drop --rollout")
        view, picked = view_from(words, hide_special, no_renorm, heads, rollout, measure.value, layers_mean)
        queries = queries_from(token, occurrence, index, required=not all_tokens)
        selection = Selection(
            queries=tuple(queries),
            layers=layer,
            part=part.value if part else None,
            view=view,
            heads=picked,
            measure=measure.value,
            # Written after the pass: counted in the memory estimate (--all-tokens --json at
            # 8k tokens passed the pass's estimate and died writing the JSON, issue 25).
            writes=(("json-plain" if measure.value == "norm" else "json",) if json_out else ())
            + (("npz",) if npz is not None else ()),
        )
        target = decoder_text(target_text, target_file)
        limit = budget(max_memory)
        text = read_input(sentence, file)
        eng = load(text, model, engine.value, device, dtype.value)
        # Every word found before the forward pass, on the part's query side.
        planned = plan(sentence_tokens(eng, text, pair, target), eng, selection, target=target)
        reading = read(planned, eng, max_memory=limit)
        att, positions = reading.attention, list(reading.queries)
        effects = None
        if ablate:
            effects = _ablate(eng, planned, att, positions, ablate_with.value, limit, json_out)
        figure = None
        if png is not None:  # laid out and held to the pixel budget before any output
            from ..render import DEFAULT_DPI, FigureStyle

            try:
                figure = token_image(shares(att), positions, DEFAULT_DPI, FigureStyle(heads=picked))
            except UsageError as exc:
                exc.facts.setdefault("command", "show")  # for the hint: show has no --dpi
                raise
        if npz is not None:
            att.save_npz(npz)
            wrote(npz)
        if json_out:
            from .output import emit_json_rows

            # Large weight arrays are spelled by numpy, not one Python float at a time (jsonrows).
            if all_tokens:
                emit_json_rows(att.to_dict(raw_rows=True))
            else:
                found = [att.query_dict(q, raw_rows=True) for q in positions]
                if effects is not None:
                    for entry, q in zip(found, positions, strict=True):
                        entry["ablation"] = {
                            "with": ablate_with.value,
                            "effect": "1 - cos(final hidden state at the query, the same with the head removed)",
                            "effects": [[None if x != x else round(float(x), 6) for x in row] for row in effects[q]],
                        }
                emit_json_rows(found[0] if len(found) == 1 else found)
        elif not all_tokens:
            from ..render.terminal import for_console, paged, render_show

            console = stdout_console()
            if full:
                from ..render.terminal.compact import full_grid_lines

                shown = len(picked) if picked else att.model_heads
                count = full_grid_lines(att, positions, console.width, values, shown + att.num_heads - att.model_heads)
                if count > FULL_LIMIT:
                    raise UsageError(
                        f"--full would print about {count:,} lines ({len(att.keys)} tokens, {len(att.layers)} layers)",
                        hint=f"at most {FULL_LIMIT:,}: pick layers with --layer, or drop --full for the compact view",
                    )
            with paged(console, not no_pager):
                console.print(
                    render_show(
                        shares(att),
                        positions,
                        **for_console(console),
                        values=values,
                        heads=picked,
                        effects=effects,
                        full=full,
                        top_keys=top_keys,
                    )
                )
        if png is not None and figure is not None:
            from ..render import DEFAULT_DPI
            from ..render.image import save_figure

            wrote(png, save_figure(figure, png, DEFAULT_DPI))


def _ablate(
    eng: Any, planned: Any, att: Attention, positions: list[int], mode: str, limit: int | None, quiet: bool
) -> dict[int, Any]:
    """Per query position in ``att``: the (N, H) effects of removing each head of the shown
    layers (NaN elsewhere), averaged over the query's tokens."""
    from ..engines import cpu_threads_for
    from ..measures.ablation import Runner, ablate_text, batch_size
    from .ablating import delayed_progress

    runner = Runner(eng, planned.tokens, planned.part, planned.target)
    batch = batch_size(eng, len(planned.tokens) + (len(planned.target) if planned.target else 0), limit)
    with delayed_progress("ablating", quiet) as progress, cpu_threads_for(eng, len(planned.tokens) * batch):
        found = ablate_text(runner, mode, batch, att.layers, progress=progress)
    if found.partial:
        raise KeyboardInterrupt
    return {q: found.effect[:, :, list(att.pieces_of_query(att.query_slot(q)))].mean(-1) for q in positions}
