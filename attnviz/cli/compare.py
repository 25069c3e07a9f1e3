"""attnviz compare: rank the heads by what one token does; minimal pairs with --vs/--pairs."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .ablating import AblateOpt, AblateWith, AblateWithOpt
from .app import EXAMPLE, app, errors
from .common import budget, decoder_text, load, query_from, read_input, sentence_tokens, stdout_console, view_from
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
    SortKey,
    TargetFileOpt,
    TargetTextOpt,
    TextArg,
    TokenOpt,
    WordsOpt,
)

if TYPE_CHECKING:
    from ..engines import Engine
    from ..measures.pairs import MinimalPair, PairOptions
    from ..result import Attention

PAIRS_LIMIT = 5  # heads shown per pair with --pairs, unless --limit says otherwise

TargetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--target",
        metavar="WORD[:N]",
        help="Word to measure the token's attention to (repeatable; pieces summed; every occurrence, "
        "or WORD:N for the N-th).",
    ),
]
SortOpt = Annotated[
    SortKey | None,
    typer.Option(
        "--sort",
        help="weight (first --target, else top weight) | entropy (most focused first) | sink | distance | "
        "delta (largest change, with --vs) | effect (largest first, with --ablate) "
        "[default: delta with --vs, else weight].",
        show_default=False,
    ),
]


ExcludeOpt = Annotated[
    str,
    typer.Option(
        "--exclude",
        metavar="KINDS",
        help="Leave these targets out of the top list (and so of the default sort): special, adjacent "
        "(the token itself and its neighbours), punct; comma-separated, or none.",
    ),
]
SUMMARY_HEADS = 10  # heads in the --pairs summary


@app.command(epilog=example(f'attnviz compare "{EXAMPLE}" --token it --target animal'))
def compare(
    sentence: TextArg = None,
    file: FileOpt = None,
    token: TokenOpt = None,
    target: TargetOpt = None,
    vs: Annotated[
        str | None,
        typer.Option(
            "--vs",
            metavar="SENTENCE",
            help="A second sentence (a minimal pair): per head, the change in each target's weight.",
        ),
    ] = None,
    pairs: Annotated[
        Path | None,
        typer.Option(
            "--pairs",
            metavar="PATH",
            help="Run every pair of a tab-separated file (sentence_a, sentence_b, token, targets), "
            f"e.g. samples/minimal_pairs.tsv; {PAIRS_LIMIT} heads each unless --limit, then a summary.",
            show_default=False,
        ),
    ] = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    top: Annotated[
        int, typer.Option("--top", "-k", metavar="N", min=1, help="How many strongest targets to list per head.")
    ] = 3,
    exclude: ExcludeOpt = "special,adjacent,punct",
    sort: SortOpt = None,
    limit: Annotated[
        int | None, typer.Option("--limit", metavar="N", min=1, help="Show only the first N heads.")
    ] = None,
    layer: LayerOpt = "all",
    words: WordsOpt = False,
    hide_special: HideSpecialOpt = False,
    no_renorm: NoRenormOpt = False,
    heads: HeadsOpt = None,
    rollout: RolloutOpt = False,
    measure: MeasureOpt = Measure.weight,
    ablate: AblateOpt = False,
    ablate_with: AblateWithOpt = AblateWith.zero,
    layers_mean: LayersMeanOpt = False,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the --pairs bootstrap.")] = 0,
    model: ModelOpt = None,
    engine: EngineOpt = EngineName.own,
    device: DeviceOpt = "auto",
    target_text: TargetTextOpt = None,
    target_file: TargetFileOpt = None,
    part: PartOpt = None,
    pair: PairOpt = None,
    json_out: JsonOpt = False,
    no_pager: NoPagerOpt = False,
    dtype: DtypeOpt = DType.float32,
    max_memory: MaxMemoryOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Rank the heads by what one token does: top targets, weight on --target words,
    entropy, sink, self/prev/next shares, distance; with --vs, the change between two sentences.

    Without --target the heads are ranked by their strongest link that is not to a special
    token, punctuation or the token's neighbours (--exclude none: any link).
    """
    with errors(debug):
        from ..errors import UsageError
        from ..io.safeio import check_text
        from ..measures.metrics import check_sort, head_stats, parse_exclude, sort_rows
        from ..measures.pairs import MinimalPair, PairOptions, read_pairs, run_pair
        from ..pipeline import Selection, plan, read
        from ..render.terminal import for_console, paged
        from ..render.terminal.tables import render_compare
        from ..transforms import shares

        targets = tuple(target or ())
        pairwise = vs is not None or pairs is not None
        decoder = decoder_text(target_text, target_file)
        if pairwise and (decoder is not None or part is not None or pair is not None):
            # Minimal pairs align one token across two sentences of one stack.
            raise UsageError(
                "--vs and --pairs compare single sentences; they do not take --target-text, --part or --pair",
                hint="compare one sentence (pair) at a time",
            )
        # Cheap checks first: none of these needs the model.
        by = check_sort(sort.value if sort else None, pairwise)
        try:
            kinds = parse_exclude(exclude)
        except ValueError as exc:
            raise UsageError(str(exc), hint="e.g. --exclude special,adjacent,punct or --exclude none") from None
        reading, picked = view_from(words, hide_special, no_renorm, heads, rollout, measure.value, layers_mean)
        if by == "effect" and not ablate:
            raise UsageError("sorting by effect needs the heads ablated", hint="add --ablate")
        if ablate and pairwise:
            raise UsageError("--ablate ranks the heads of one sentence", hint="drop --vs/--pairs, or --ablate")
        if ablate and rollout:
            raise UsageError("rollout's rows are not heads: there is nothing to ablate", hint="drop --rollout")
        if picked is not None:
            raise UsageError("compare ranks every head", hint="use --heads mean or max here, --layer to narrow")
        memory_limit = budget(max_memory)
        options = PairOptions(
            occurrence=occurrence,
            layers=layer,
            top=top,
            view=reading,
            exclude=kinds,
            max_memory=memory_limit,
            measure=measure.value,
        )
        if pairs is not None:
            if any(x is not None for x in (sentence, file, vs, token, index)) or targets:
                raise UsageError(
                    "--pairs takes the sentences, token and targets from the file",
                    hint="drop the sentence, --file, --vs, --token, --target and --index",
                )
            found = read_pairs(pairs)  # a bad file fails before the model loads
            eng = load(found[0].sentence_a, model, engine.value, device, dtype.value)
            _compare_pairs(eng, found, pairs, options, by, limit, seed, json_out, no_pager)
            return
        if sentence is None and file is None:
            raise UsageError(
                "give a sentence (or --file PATH, or --pairs FILE)", hint=f'e.g. attnviz compare "{EXAMPLE}" --token it'
            )
        if vs is not None:
            if index is not None:
                raise UsageError("--vs aligns the token by its text", hint="use --token WORD instead of --index")
            if not targets:
                raise UsageError("--vs compares the weight on --target words", hint="add --target WORD (repeatable)")
            check_text(vs)
        query = query_from(token, occurrence, index)
        # Target forms checked here.
        selection = Selection(
            queries=() if query is None else (query,),
            layers=layer,
            targets=targets,
            part=part.value if part else None,
            view=reading,
            measure=measure.value,
        )
        text = read_input(sentence, file)
        eng = load(text, model, engine.value, device, dtype.value)
        effects = None
        if vs is None:
            source = sentence_tokens(eng, text, pair, decoder)
            planned = plan(source, eng, selection, target=decoder)
            got = read(planned, eng, max_memory=memory_limit)
            att = shares(got.attention)  # the norm measure's rows as shares: stats of a distribution
            rows = head_stats(att, got.queries[0], got.targets, top, kinds)
            if ablate:
                from .ablating import ablate_reading, with_effects

                effects = ablate_reading(eng, planned, planned.layers, ablate_with.value, memory_limit, json_out)
                rows = with_effects(rows, effects, planned.queries[0])
            rows = sort_rows(rows, by, limit)
        else:
            assert token is not None  # query_from needs --token or --index, and --index was refused
            result = run_pair(eng, MinimalPair(text, vs, token, targets), **options.kwargs())
            att = result.att_a
            rows = sort_rows(result.stats, by, limit)
        if json_out:
            out = {**_meta(att, kinds, by), "rows": [row.to_dict() for row in rows]}
            if effects is not None:
                out["ablation"] = _ablation_meta(effects)
            from .output import emit_json

            emit_json(out)
        else:
            console = stdout_console()
            with paged(console, not no_pager):
                console.print(render_compare(att, att.queries[:1], rows, by, **for_console(console), exclude=kinds))
                if effects is not None:
                    from rich.text import Text

                    console.print(Text(_ablation_rule(effects), style="dim"))
        if effects is not None and effects.partial:
            from ..errors import ExitCode
            from .ablating import interrupted_note

            interrupted_note(effects)
            raise SystemExit(ExitCode.INTERRUPTED)


def _meta(att: Attention, exclude: Sequence[str], by: str) -> dict[str, object]:
    """What every compare --json carries: the model's provenance, the reading, the sort."""
    from ..result import provenance_fields

    out: dict[str, object] = provenance_fields(att.provenance)
    out["measure"] = att.measure
    if att.steps:
        out["steps"] = list(att.steps)
    out["exclude"] = list(exclude)
    out["sort"] = by
    return out


def _ablation_meta(effects: Any) -> dict[str, object]:
    """The --json "ablation" object: what was removed, how the effect is measured."""
    out: dict[str, object] = {
        "with": effects.mode,
        "effect": "1 - cos(final hidden state at the query, the same with the head removed before W^O)",
        "passes": effects.passes,
        "partial": effects.partial,
    }
    if effects.lm_kind is not None:
        out["lm"] = effects.lm_kind
        out["top_token"] = effects.top_token
    return out


def _ablation_rule(effects: Any) -> str:
    """The footnote under an --ablate table."""
    removed = "replaced by its mean over the text's tokens" if effects.mode == "mean" else "set to zero"
    text = (
        f"effect: 1 − cos of the token's final hidden state when the head's output is {removed} "
        f"before W^O ({effects.passes} forward passes)"
    )
    if effects.lm_kind is not None:
        what = "next token" if effects.lm_kind == "causal" else "token, masked"
        text += (
            f"; kl: KL(p ‖ p_ablated) of the {what} (nats); Δlogp: change in log p of its top token "
            f"{effects.top_token!r}"
        )
    return text


def _compare_pairs(
    eng: Engine,
    found: list[MinimalPair],
    path: Path,
    options: PairOptions,
    by: str,
    limit: int | None,
    seed: int,
    json_out: bool,
    no_pager: bool,
) -> None:
    """Every pair of a file through one loaded engine, then the summary across pairs."""
    from rich.text import Text

    from ..measures.findings import pair_shifts, toward_referent
    from ..measures.metrics import sort_rows
    from ..measures.pairs import run_pairs
    from ..render.terminal import for_console, paged, uses_colour
    from ..render.terminal.shifts import shifts_table
    from ..render.terminal.tables import render_compare

    console = stdout_console()
    everything: list[dict[str, object]] = []
    unsorted = []
    att = None
    with contextlib.ExitStack() as stack:
        if not json_out:
            stack.enter_context(paged(console, not no_pager))
        for n, result in enumerate(run_pairs(eng, found, path, **options.kwargs()), 1):
            att = result.att_a
            unsorted.append(result.stats)
            rows = sort_rows(result.stats, by, PAIRS_LIMIT if limit is None else limit)
            p = result.pair
            if json_out:
                meta = {"pair": n, "sentence": p.sentence_a, "sentence_vs": p.sentence_b, "token": p.token}
                everything += [{**meta, **row.to_dict()} for row in rows]
                continue
            indent = " " * len(f"{n}. ")
            console.print(Text(f"{n}. A: {p.sentence_a}\n{indent}B: {p.sentence_b}", style="bold"))
            shown = render_compare(
                result.att_a,
                result.att_a.queries[:1],
                rows,
                by,
                **for_console(console),
                header=n == 1,
                exclude=options.exclude,
            )
            console.print(shown)
            console.print()
        toward, heads = toward_referent(unsorted)
        shifts = pair_shifts(toward, heads, seed=seed)
        if json_out:
            assert att is not None  # read_pairs returns at least one pair
            out = {**_meta(att, options.exclude, by), "rows": everything}
            out["summary"] = [s.to_dict() for s in shifts]
            out["summary_rule"] = SUMMARY_RULE.format(n=len(unsorted), seed=seed)
            from .output import emit_json

            emit_json(out)
            return
        title = f"across {len(unsorted)} pairs, {SUMMARY_HEADS} heads that move most toward the referent"
        console.print(shifts_table(shifts[:SUMMARY_HEADS], color=uses_colour(console), title=title))
        console.print(Text(SUMMARY_RULE.format(n=len(unsorted), seed=seed), style="dim"))


SUMMARY_RULE = (
    "toward referent: weight on the pair's first target (the referent in A) in A minus in B, "
    "mean over {n} pairs; pairs: how many moved that way; interval: percentile bootstrap of the mean "
    "(2000 resamples of the pairs, seed {seed})"
)
