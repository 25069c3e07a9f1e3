"""attnviz show: head by head, where one token puts its attention."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .app import EXAMPLE, app, errors
from .common import queries_from, stdout_console, wrote
from .conventions import example
from .generating import SeedOpt
from .groups import Ablation, Generating, ModelChoice, Reading, TextInput, TextPair, grouped
from .options import DebugOpt, IndexOpt, JsonOpt, LayerOpt, NoPagerOpt, Occurrence, TokensOpt

if TYPE_CHECKING:
    from ..result import Attention

FULL_LIMIT = 100_000  # lines --full may print

AllTokensOpt = Annotated[
    bool, typer.Option("--all-tokens", help="Every token's rows (the full matrices), for --json or --npz.")
]
ValuesOpt = Annotated[bool, typer.Option("--values", help="Print each weight in its cell.")]
FullOpt = Annotated[bool, typer.Option("--full", help="The full grid even when a row wraps into more than two blocks.")]
TopKeysOpt = Annotated[
    int | None,
    typer.Option(
        "--top-keys",
        metavar="K",
        min=1,
        help="Compact view: how many strongest keys each head line names [default: 2 at 80 columns, 3 wider].",
        show_default=False,
    ),
]
NpzOpt = Annotated[
    Path | None,
    typer.Option("--npz", metavar="PATH", help="Also write the weights and their provenance to an .npz file."),
]
PngOpt = Annotated[
    Path | None,
    typer.Option("--png", metavar="PATH", help="Also write the heatmaps to this PNG file.", show_default=False),
]


@app.command(epilog=example(f'attnviz show "{EXAMPLE}" --token it'))
@grouped(
    layout="sentence file token occurrence index all_tokens model engine layer device words hide_special no_renorm "
    "heads rollout layers_mean target_text target_file part pair measure values ablate ablate_with full top_keys "
    "json_out npz png no_pager generate sample temperature top_p seed dtype max_memory debug"
)
def show(
    *,
    text: TextInput,
    token: TokensOpt = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    all_tokens: AllTokensOpt = False,
    model: ModelChoice,
    layer: LayerOpt = "all",
    reading: Reading,
    second: TextPair,
    values: ValuesOpt = False,
    ablation: Ablation,
    full: FullOpt = False,
    top_keys: TopKeysOpt = None,
    json_out: JsonOpt = False,
    npz: NpzOpt = None,
    png: PngOpt = None,
    no_pager: NoPagerOpt = False,
    generation: Generating,
    seed: SeedOpt = None,
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
        from ..transforms import shares
        from . import generating
        from .export import token_image

        # Before any model work: a typo should cost nothing.
        text.need()
        sampling = None
        if generation.asked(seed):
            others = {"png": png, "npz": npz, "all_tokens": all_tokens, "index": index, "full": full, "values": values}
            args = (text, model, reading, second, ablation, layer, token, json_out, top_keys, others, generation, seed)
            sampling = generating.show(*args)
            if sampling is None:  # the compact per-step view, printed
                return
        _check_outputs(png, npz, all_tokens, bool(token) or index is not None, json_out, ablation.ablate, reading)
        view, picked = reading.view()
        queries = queries_from(token, occurrence, index, required=not all_tokens and sampling is None)
        selection = Selection(
            queries=tuple(queries),
            layers=layer,
            part=second.part_name,
            view=view,
            heads=picked,
            measure=reading.measure_name,
            writes=_writes(reading.measure_name, json_out, npz),
        )
        target = second.decoder_text()
        limit = model.budget()
        sentence = text.read()
        eng = model.load(sentence)
        source, written, selection, _ = generation.continued(
            eng, second.source(eng, sentence, target), selection, sampling, json_out
        )
        # Every word found before the forward pass, on the part's query side.
        planned = plan(source, eng, selection, target=written or target)
        got = read(planned, eng, max_memory=limit)
        att, positions = got.attention, list(got.queries)
        if ablation.mode is not None:
            from ..analyses import query_effects
            from .ablating import delayed_progress

            with delayed_progress("ablating", json_out) as progress:
                att = replace(att, effects=query_effects(eng, planned, att, ablation.mode, limit, progress))
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
            # --all-tokens writes the whole document only: a dict per query beside it took
            # 1.6 GB at 2,048 tokens, past the estimate (issue 38).
            if all_tokens:
                emit_json_rows(att.to_dict(raw_rows=True))
            else:
                found = [att.query_dict(q, raw_rows=True) for q in positions]
                emit_json_rows(found[0] if len(found) == 1 else found)
        elif not all_tokens:
            _print(att, positions, picked, values, full, top_keys, no_pager)
        if png is not None and figure is not None:
            from ..render import DEFAULT_DPI
            from ..render.image import save_figure

            wrote(png, save_figure(figure, png, DEFAULT_DPI))


def _check_outputs(
    png: Path | None, npz: Path | None, all_tokens: bool, asked: bool, json_out: bool, ablate: bool, reading: Reading
) -> None:
    """show's output options against each other, before any model work."""
    from ..errors import UsageError
    from ..result import check_writable

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
        if asked:
            raise UsageError("--all-tokens reads every token", hint="drop --token/--index, or drop --all-tokens")
        if not (json_out or npz):
            raise UsageError("--all-tokens prints every row as data", hint="add --json or --npz PATH")
        if png is not None:
            raise UsageError("--png draws one token", hint="use attnviz export --view matrix for whole matrices")
    if ablate and all_tokens:
        raise UsageError("--ablate measures one token's heads", hint="drop --all-tokens, and name a --token")
    if ablate and reading.rollout:
        raise UsageError("rollout's rows are not heads: there is nothing to ablate", hint="drop --rollout")


def _writes(measure: str, json_out: bool, npz: Path | None) -> tuple[str, ...]:
    # Written after the pass: counted in the memory estimate (--all-tokens --json at
    # 8k tokens passed the pass's estimate and died writing the JSON, issue 25).
    from ..measures.base import measure_named

    return (("json" if measure_named(measure).sums_to_one else "json-plain",) if json_out else ()) + (
        ("npz",) if npz else ()
    )


def _print(
    att: Attention,
    positions: list[int],
    picked: tuple[int, ...] | None,
    values: bool,
    full: bool,
    top_keys: int | None,
    no_pager: bool,
) -> None:
    """show's terminal answer, paged."""
    from ..errors import UsageError
    from ..render.terminal import for_console, paged, render_show
    from ..transforms import shares

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
    effects = None if att.effects is None else {q: att.effects.at(att.query_slot(q)) for q in positions}
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
