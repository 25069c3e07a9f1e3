"""attnviz compare: rank the heads by what one token does; minimal pairs with --vs/--pairs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from . import EXAMPLE, app, errors
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
    SortKey,
    TargetFileOpt,
    TargetTextOpt,
    TokenOpt,
)

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
        "-s",
        help="weight (first --target, else top weight) | entropy (most focused first) | sink | distance | "
        "delta (largest change, with --vs) [default: delta with --vs, else weight].",
        show_default=False,
    ),
]


@app.command()
def compare(
    sentence: Annotated[
        str | None,
        typer.Argument(metavar="SENTENCE", help="The sentence to run through the model.", show_default=False),
    ] = None,
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
            f"e.g. samples/minimal_pairs.tsv; {PAIRS_LIMIT} heads each unless --limit.",
            show_default=False,
        ),
    ] = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    top: Annotated[
        int, typer.Option("--top", "-k", metavar="N", min=1, help="How many strongest targets to list per head.")
    ] = 3,
    sort: SortOpt = None,
    limit: Annotated[
        int | None, typer.Option("--limit", metavar="N", min=1, help="Show only the first N heads.")
    ] = None,
    layer: LayerOpt = "all",
    model: ModelOpt = None,
    engine: EngineOpt = EngineName.own,
    device: DeviceOpt = "auto",
    target_text: TargetTextOpt = None,
    target_file: TargetFileOpt = None,
    part: PartOpt = None,
    pair: PairOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Rank the heads by what one token does: top targets, weight on --target words,
    entropy, sink, self/prev/next shares, distance; with --vs, the change between two sentences.

    Example: attnviz compare "The animal didn't cross the street because it was too tired" --token it --target animal
    """
    with errors(debug):
        from ..engines import run
        from ..errors import UsageError
        from ..metrics import check_sort, head_stats, sort_rows
        from ..pairs import MinimalPair, read_pairs, run_pair, run_pairs
        from ..render.tables import render_compare
        from ..select import Selection
        from ..tokens import check_text

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
        if pairs is not None:
            if sentence is not None or vs is not None or token is not None or targets or index is not None:
                raise UsageError(
                    "--pairs takes the sentences, token and targets from the file",
                    hint="drop the sentence, --vs, --token, --target and --index",
                )
            found = read_pairs(pairs)  # a bad file fails before the model loads
            eng = load(found[0].sentence_a, model, engine.value, device)
            console = None if json_out else stdout_console()
            everything = []
            results = run_pairs(eng, found, pairs, occurrence=occurrence, layers=layer, top=top)
            for n, result in enumerate(results, start=1):
                rows = sort_rows(result.stats, by, PAIRS_LIMIT if limit is None else limit)
                if console is None:
                    p = result.pair
                    meta = {"pair": n, "sentence": p.sentence_a, "sentence_vs": p.sentence_b, "token": p.token}
                    everything += [{**meta, **row.to_dict()} for row in rows]
                    continue
                from rich.text import Text

                indent = " " * len(f"{n}. ")
                console.print(
                    Text(f"{n}. A: {result.pair.sentence_a}\n{indent}B: {result.pair.sentence_b}", style="bold")
                )
                render_compare(console, result.att_a, result.att_a.queries, rows, by, header=n == 1)
                console.print()
            if json_out:
                typer.echo(json.dumps(everything, ensure_ascii=False))
            return
        if sentence is None:
            raise UsageError("give a sentence (or --pairs FILE)", hint=f'e.g. attnviz compare "{EXAMPLE}" --token it')
        if vs is not None:
            if index is not None:
                raise UsageError("--vs aligns the token by its text", hint="use --token WORD instead of --index")
            if not targets:
                raise UsageError("--vs compares the weight on --target words", hint="add --target WORD (repeatable)")
            check_text(vs)
        query = query_from(token, occurrence, index)
        # Target forms checked here.
        selection = Selection(query=query, layers=layer, targets=targets, part=part.value if part else None)
        eng = load(sentence, model, engine.value, device)
        if vs is None:
            att, resolved = run(sentence_tokens(eng, sentence, pair, decoder), eng, selection, target=decoder)
            rows = sort_rows(head_stats(att, resolved.queries, resolved.targets, top), by, limit)
            queries = resolved.queries
        else:
            assert token is not None  # query_from needs --token or --index, and --index was refused
            result = run_pair(
                eng, MinimalPair(sentence, vs, token, targets), occurrence=occurrence, layers=layer, top=top
            )
            att, queries = result.att_a, result.att_a.queries
            rows = sort_rows(result.stats, by, limit)
        if json_out:
            typer.echo(json.dumps([row.to_dict() for row in rows], ensure_ascii=False))
            return
        render_compare(stdout_console(), att, queries, rows, by)
