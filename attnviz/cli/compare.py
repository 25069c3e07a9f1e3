"""attnviz compare: rank the heads by what one token does; minimal pairs with --vs/--pairs."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .app import EXAMPLE, app, errors
from .common import query_from, stdout_console
from .conventions import example
from .groups import Ablation, Generating, ModelChoice, Reading, TextInput, TextPair, grouped
from .options import (
    DebugOpt,
    IndexOpt,
    JsonOpt,
    LayerOpt,
    NoPagerOpt,
    Occurrence,
    SortKey,
    TokenOpt,
)

if TYPE_CHECKING:
    from ..engines import Engine
    from ..measures.pairs import MinimalPair, PairOptions

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
VsOpt = Annotated[
    str | None,
    typer.Option(
        "--vs",
        metavar="SENTENCE",
        help="A second sentence (a minimal pair): per head, the change in each target's weight.",
    ),
]
PairsOpt = Annotated[
    Path | None,
    typer.Option(
        "--pairs",
        metavar="PATH",
        help="Run every pair of a tab-separated file (sentence_a, sentence_b, token, targets), "
        f"e.g. samples/minimal_pairs.tsv; {PAIRS_LIMIT} heads each unless --limit, then a summary.",
        show_default=False,
    ),
]
TopOpt = Annotated[
    int, typer.Option("--top", "-k", metavar="N", min=1, help="How many strongest targets to list per head.")
]
LimitOpt = Annotated[int | None, typer.Option("--limit", metavar="N", min=1, help="Show only the first N heads.")]
SeedOpt = Annotated[
    int, typer.Option("--seed", metavar="N", help="Seed of the --pairs bootstrap, and of --generate --sample.")
]
SUMMARY_HEADS = 10  # heads in the --pairs summary


@app.command(epilog=example(f'attnviz compare "{EXAMPLE}" --token it --target animal'))
@grouped(
    layout="sentence file token target vs pairs occurrence index top exclude sort limit layer words hide_special "
    "no_renorm heads rollout measure ablate ablate_with layers_mean generate sample temperature top_p seed model "
    "engine device target_text target_file part pair json_out no_pager dtype max_memory debug"
)
def compare(
    *,
    text: TextInput,
    token: TokenOpt = None,
    target: TargetOpt = None,
    vs: VsOpt = None,
    pairs: PairsOpt = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    top: TopOpt = 3,
    exclude: ExcludeOpt = "special,adjacent,punct",
    sort: SortOpt = None,
    limit: LimitOpt = None,
    layer: LayerOpt = "all",
    reading: Reading,
    ablation: Ablation,
    generation: Generating,
    seed: SeedOpt = 0,
    model: ModelChoice,
    second: TextPair,
    json_out: JsonOpt = False,
    no_pager: NoPagerOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Rank the heads by what one token does: top targets, weight on --target words,
    entropy, sink, self/prev/next shares, distance; with --vs, the change between two sentences.

    Without --target the heads are ranked by their strongest link that is not to a special
    token, punctuation or the token's neighbours (--exclude none: any link).

    With --generate N the model first writes up to N tokens; the heads are ranked for the
    first written token, or the --token named (written tokens are marked «like this»).
    """
    with errors(debug):
        from ..measures.metrics import head_stats, ranking_dict, sort_rows
        from ..measures.pairs import MinimalPair, PairOptions, read_pairs, run_pair
        from ..pipeline import Selection, plan, read
        from ..transforms import shares

        targets = tuple(target or ())
        pairwise = vs is not None or pairs is not None
        decoder = second.decoder_text()
        by, kinds, view = _check(second, decoder, pairwise, sort, exclude, reading, ablation.ablate)
        sampling = generation.check(seed if generation.sample else None, vs=vs is not None, pairs=pairs is not None)
        memory_limit = model.budget()
        options = PairOptions(
            occurrence=occurrence,
            layers=layer,
            top=top,
            view=view,
            exclude=kinds,
            max_memory=memory_limit,
            measure=reading.measure_name,
        )
        if pairs is not None:
            _pairs_alone(text, vs, token, index, targets)
            found = read_pairs(pairs)  # a bad file fails before the model loads
            eng = model.load(found[0].sentence_a)
            _compare_pairs(eng, found, pairs, options, by, limit, seed, json_out, no_pager)
            return
        _check_sentences(text, vs, index, targets)
        query = query_from(token, occurrence, index, required=sampling is None)
        # Target forms checked here.
        selection = Selection(
            queries=() if query is None else (query,),
            layers=layer,
            targets=targets,
            part=second.part_name,
            view=view,
            measure=reading.measure_name,
        )
        sentence = text.read()
        eng = model.load(sentence)
        effects = None
        if vs is None:
            source = second.source(eng, sentence, decoder)
            source, written, selection, _ = generation.continued(eng, source, selection, sampling, json_out)
            planned = plan(source, eng, selection, target=written or decoder)
            got = read(planned, eng, max_memory=memory_limit)
            att = shares(got.attention)  # the norm measure's rows as shares: stats of a distribution
            rows = head_stats(att, got.queries[0], got.targets, top, kinds)
            if ablation.mode is not None:
                effects = _ablate(eng, planned, ablation.mode, memory_limit, json_out)
                from .ablating import with_effects

                rows = with_effects(rows, effects, planned.queries[0])
            rows = sort_rows(rows, by, limit)
        else:
            assert token is not None  # query_from needs --token or --index, and --index was refused
            result = run_pair(eng, MinimalPair(sentence, vs, token, targets), **options.kwargs())
            att = result.att_a
            rows = sort_rows(result.stats, by, limit)
        if json_out:
            from .output import emit_json

            emit_json(ranking_dict(att, rows, kinds, by, None if effects is None else effects.to_dict()))
        else:
            _print(att, rows, by, kinds, effects, no_pager)
        if effects is not None and effects.partial:
            from ..errors import ExitCode
            from .ablating import interrupted_note

            interrupted_note(effects)
            raise SystemExit(ExitCode.INTERRUPTED)


def _check(
    second: TextPair,
    decoder: str | None,
    pairwise: bool,
    sort: SortKey | None,
    exclude: str,
    reading: Reading,
    ablate: bool,
) -> tuple[str, tuple[str, ...], Any]:
    """compare's options against each other, before any model work: the sort key, the
    excluded kinds and the reading's ``View``."""
    from ..errors import UsageError
    from ..measures.metrics import check_sort, parse_exclude

    if pairwise and (decoder is not None or second.part is not None or second.pair is not None):
        # Minimal pairs align one token across two sentences of one stack.
        raise UsageError(
            "--vs and --pairs compare single sentences; they do not take --target-text, --part or --pair",
            hint="compare one sentence (pair) at a time",
        )
    by = check_sort(SortKey(sort).value if sort else None, pairwise)
    try:
        kinds = parse_exclude(exclude)
    except ValueError as exc:
        raise UsageError(str(exc), hint="e.g. --exclude special,adjacent,punct or --exclude none") from None
    view, picked = reading.view()
    if by == "effect" and not ablate:
        raise UsageError("sorting by effect needs the heads ablated", hint="add --ablate")
    if ablate and pairwise:
        raise UsageError("--ablate ranks the heads of one sentence", hint="drop --vs/--pairs, or --ablate")
    if ablate and reading.rollout:
        raise UsageError("rollout's rows are not heads: there is nothing to ablate", hint="drop --rollout")
    if picked is not None:
        raise UsageError("compare ranks every head", hint="use --heads mean or max here, --layer to narrow")
    return by, tuple(kinds), view


def _pairs_alone(
    text: TextInput, vs: str | None, token: str | None, index: int | None, targets: tuple[str, ...]
) -> None:
    """--pairs takes everything else from its file."""
    from ..errors import UsageError

    if any(x is not None for x in (text.sentence, text.file, vs, token, index)) or targets:
        raise UsageError(
            "--pairs takes the sentences, token and targets from the file",
            hint="drop the sentence, --file, --vs, --token, --target and --index",
        )


def _check_sentences(text: TextInput, vs: str | None, index: int | None, targets: tuple[str, ...]) -> None:
    """One sentence (and --vs's second): given, and --vs's needs, before any model work."""
    from ..errors import UsageError
    from ..io.safeio import check_text

    if text.sentence is None and text.file is None:
        raise UsageError(
            "give a sentence (or --file PATH, or --pairs FILE)", hint=f'e.g. attnviz compare "{EXAMPLE}" --token it'
        )
    if vs is not None:
        if index is not None:
            raise UsageError("--vs aligns the token by its text", hint="use --token WORD instead of --index")
        if not targets:
            raise UsageError("--vs compares the weight on --target words", hint="add --target WORD (repeatable)")
        check_text(vs)


def _ablate(eng: Engine, planned: Any, mode: str, limit: int | None, quiet: bool) -> Any:
    from ..analyses import plan_effects
    from .ablating import delayed_progress

    with delayed_progress("ablating", quiet) as progress:
        return plan_effects(eng, planned, planned.layers, mode, limit, progress)


def _print(att: Any, rows: Any, by: str, kinds: Any, effects: Any, no_pager: bool) -> None:
    from ..render.terminal import for_console, paged
    from ..render.terminal.tables import render_compare

    console = stdout_console()
    with paged(console, not no_pager):
        console.print(render_compare(att, att.queries[:1], rows, by, **for_console(console), exclude=kinds))
        if effects is not None:
            from rich.text import Text

            console.print(Text(_ablation_rule(effects), style="dim"))


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

    from ..measures.findings import SUMMARY_RULE, pair_rows, pair_shifts, pairs_dict, toward_referent
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
                everything += pair_rows(n, p.sentence_a, p.sentence_b, p.token, rows)
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
            from .output import emit_json

            emit_json(pairs_dict(att, options.exclude, by, everything, shifts, len(unsorted), seed))
            return
        title = f"across {len(unsorted)} pairs, {SUMMARY_HEADS} heads that move most toward the referent"
        console.print(shifts_table(shifts[:SUMMARY_HEADS], color=uses_colour(console), title=title))
        console.print(Text(SUMMARY_RULE.format(n=len(unsorted), seed=seed), style="dim"))
