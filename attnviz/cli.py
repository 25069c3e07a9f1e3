"""The ``attnviz`` command line: parse options, call the library, render, map errors.

Thin by design: no math and no model code here. Heavy imports (torch, transformers,
matplotlib) happen inside the commands, so ``attnviz --help`` stays fast.

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or input, 130 interrupted.
Results go to stdout; errors and diagnostics to stderr, one line each.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

try:  # typer >= 0.26 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as click_exc  # type: ignore[no-redef]

from . import __version__
from .errors import AttnvizError, UsageError
from .render import DEFAULT_DPI, IMAGE_FORMATS  # constants only: no matplotlib

if TYPE_CHECKING:
    from rich.console import Console

    from .engines import Engine
    from .result import Attention
    from .tokens import Tokens

EXAMPLE = "The animal didn't cross the street because it was too tired"


class _Group(TyperGroup):
    """Click's usage errors, as one line on stderr with a hint (not a boxed panel)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click_exc.NoArgsIsHelpError:
            sys.exit(0)  # the help text has been printed: that is the answer
        except click_exc.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "attnviz"
            _fail(exc.format_message(), f"see '{command} --help'", 2)
        except typer.Abort:
            _fail("interrupted", None, 130)
        except click_exc.ClickException as exc:  # e.g. a FileError
            _fail(exc.format_message(), None, exc.exit_code)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_Group,
    name="attnviz",
    help="See what each attention head of a transformer does with a token.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _fail(message: str, hint: str | None, code: int) -> NoReturn:
    line = f"attnviz: error: {message}"
    if hint:
        line += f" (hint: {hint})"
    sys.stderr.write(line.replace("\n", " ") + "\n")
    sys.stderr.flush()
    raise SystemExit(code)


@contextlib.contextmanager
def errors(debug: bool) -> Iterator[None]:
    """Turn library exceptions into one stderr line and an exit code."""
    try:
        yield
    except AttnvizError as exc:
        if debug:
            raise
        _fail(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", None, 130)
    except BrokenPipeError:
        # The reader went away (| head): not our failure to report.
        with contextlib.suppress(Exception):
            sys.stdout = open("/dev/null", "w")  # noqa: SIM115 - silence the final flush
        raise SystemExit(1) from None
    except (typer.Exit, SystemExit):
        raise
    except Exception as exc:
        if debug:
            raise
        _fail(
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
            "rerun with --debug for the traceback, and report it if it looks like a bug",
            1,
        )


def _version(value: bool) -> None:
    if value:
        typer.echo(f"attnviz {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """See what each attention head of a transformer does with a token."""


# Shared options, so every command spells them the same way.
Sentence = Annotated[str, typer.Argument(help="The sentence to run through the model.", show_default=False)]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", "-t", help="Word whose attention to show (case-insensitive; all of its pieces)."),
]
Occurrence = Annotated[
    int | None, typer.Option("--occurrence", "-n", min=1, help="Which occurrence of a repeated word (1 = first).")
]
IndexOpt = Annotated[int | None, typer.Option("--index", "-i", help="Raw token position instead of --token (0-based).")]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Checkpoint directory or Hub id [default: packaged all-MiniLM-L6-v2]."),
]
EngineOpt = Annotated[
    str, typer.Option("--engine", "-e", help="own: our multi-head attention; hf: transformers' own heads.")
]
LayerOpt = Annotated[str, typer.Option("--layer", "-l", help="Layer(s), 0-based: N, N,M, A-B or all.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda, cuda:N or mps.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")]


def stdout_console() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def check_query_args(token: str | None, occurrence: int | None, index: int | None, required: bool = True) -> None:
    """The --token/--occurrence/--index combinations, checked before any model work."""
    if token is not None and index is not None:
        raise UsageError("give --token or --index, not both", hint="--token WORD picks by text, --index K by position")
    if index is not None and occurrence is not None:
        raise UsageError("--occurrence goes with --token, not --index", hint="drop --occurrence")
    if required and token is None and index is None:
        raise UsageError("say which token to inspect", hint="add --token WORD (or --index K)")


def pick_queries(tokens: Tokens, token: str | None, occurrence: int | None, index: int | None) -> tuple[int, ...]:
    """The token positions asked for with --token/--occurrence or --index (none: ())."""
    from .tokens import check_index, find_word

    if token is not None:
        return find_word(tokens, token, occurrence)
    if index is not None:
        return (check_index(tokens, index),)
    return ()


def prepare(
    sentence: str,
    model: str | None,
    engine: str,
    device: str,
    token: str | None = None,
    occurrence: int | None = None,
    index: int | None = None,
    need_query: bool = True,
) -> tuple[Engine, Tokens, tuple[int, ...]]:
    """Validate cheap inputs, load the engine, tokenize, pick the query tokens."""
    from .engines import load_engine

    if not sentence.strip():
        raise UsageError("the sentence is empty", hint=f'give some text, e.g. attnviz show "{EXAMPLE}" --token it')
    check_query_args(token, occurrence, index, required=need_query)
    eng = load_engine(engine, model, device)
    tokens = eng.tokenize(sentence)
    queries = pick_queries(tokens, token, occurrence, index)
    return eng, tokens, queries


@app.command()
def show(
    sentence: Sentence,
    token: TokenOpt = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    model: ModelOpt = None,
    engine: EngineOpt = "own",
    layer: LayerOpt = "all",
    device: DeviceOpt = "auto",
    values: Annotated[bool, typer.Option("--values", help="Print each weight in its cell.")] = False,
    json_out: JsonOpt = False,
    png: Annotated[
        Path | None, typer.Option("--png", help="Also write the heatmaps to this PNG file.", show_default=False)
    ] = None,
    debug: DebugOpt = False,
) -> None:
    """Show, head by head, where one token puts its attention.

    Example: attnviz show "The animal didn't cross the street because it was too tired" --token it
    """
    with errors(debug):
        from .engines import inspect
        from .result import check_writable

        if png is not None:
            # Before any model work: a typo in the path should cost nothing.
            if png.suffix.lower() != ".png":
                raise UsageError(
                    f"--png writes PNG, but {str(png)!r} does not end in .png",
                    hint=f"for SVG or PDF use attnviz export ... -o {png.with_suffix('.svg').name}",
                )
            check_writable(png, (".png",))
        eng, tokens, queries = prepare(sentence, model, engine, device, token, occurrence, index)
        att = inspect(tokens, eng, layer, queries)
        if json_out:
            typer.echo(_show_json(att, queries))
        else:
            from .render.terminal import render_show

            render_show(att, queries, stdout_console(), values=values)
        if png is not None:
            _write_token_image(att, queries, png, DEFAULT_DPI)


ViewOpt = Annotated[
    str, typer.Option("--view", help="token: heads × tokens for one token, per layer; matrix: query × key per head.")
]
ImageLayerOpt = Annotated[
    str | None,
    typer.Option(
        "--layer",
        "-l",
        help="Layer(s), 0-based: N, N,M, A-B or all [default: all for --view token; the middle layer for matrix].",
        show_default=False,
    ),
]


@app.command()
def export(
    sentence: Sentence,
    output: Annotated[Path, typer.Option("--output", "-o", help="Image file: .png, .svg or .pdf.", show_default=False)],
    token: TokenOpt = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    view: ViewOpt = "token",
    layer: ImageLayerOpt = None,
    dpi: Annotated[int, typer.Option("--dpi", min=10, max=2400, help="Pixels per inch (PNG; images in SVG/PDF).")] = (
        DEFAULT_DPI
    ),
    model: ModelOpt = None,
    engine: EngineOpt = "own",
    device: DeviceOpt = "auto",
    debug: DebugOpt = False,
) -> None:
    """Write per-head attention heatmaps to a PNG, SVG or PDF file.

    --view token (default) draws, for the chosen token, heads × tokens in each layer on one
    colour scale. --view matrix draws the full query × key matrix of each head of ONE layer
    (default: the middle layer); --token is optional there and outlines that token's row.

    Example: attnviz export "The animal didn't cross the street because it was too tired" --token it -o it.png
    """
    with errors(debug):
        from .engines import inspect, parse_layers
        from .result import check_writable

        # Everything a user can get wrong without a model is checked before loading one
        # (and before importing matplotlib).
        check_writable(output, IMAGE_FORMATS)
        if view not in ("token", "matrix"):
            raise UsageError(f"unknown view {view!r}", hint="use --view token or --view matrix")
        if view == "matrix" and layer is not None and layer.strip().lower() == "all":
            raise UsageError("the matrix view draws one layer", hint="give --layer N (default: the middle layer)")
        picked = token is not None or index is not None
        if view == "token" and not picked:
            raise UsageError(
                "say which token to draw",
                hint="add --token WORD (or --index K), or use --view matrix for whole matrices",
            )
        eng, tokens, queries = prepare(
            sentence, model, engine, device, token, occurrence, index, need_query=view == "token"
        )
        if view == "token":
            att = inspect(tokens, eng, layer, queries)
            _write_token_image(att, queries, output, dpi)
            return
        chosen = parse_layers(layer, eng.num_layers) if layer is not None else (eng.num_layers // 2,)
        if len(chosen) != 1:
            raise UsageError(
                f"the matrix view draws one layer, not {len(chosen)}",
                hint="give --layer N, or use --view token for several layers",
            )
        from .render.image import matrix_figure, save_figure

        att = inspect(tokens, eng, chosen, None)  # every query row: the whole matrix
        save_figure(matrix_figure(att, chosen[0], highlight=queries), output, dpi)
        _wrote(output)


def _write_token_image(att: Attention, queries: Sequence[int], path: Path, dpi: int) -> None:
    from .render.image import save_figure, token_figure

    if len(queries) > 1:
        # One figure per token would multiply files; the first piece is the word's head.
        pieces = " + ".join(repr(att.tokens.labels[q]) for q in queries)
        sys.stderr.write(
            f"note: the word is split into {len(queries)} tokens ({pieces}); the image shows the first "
            "(use --index for another)\n"
        )
    save_figure(token_figure(att, queries[0]), path, dpi)
    _wrote(path)


def _wrote(path: Path) -> None:
    # The file is the result; a confirmation is a diagnostic, so stderr (stdout may be --json).
    sys.stderr.write(f"wrote {path}\n")


TargetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--target",
        help="Word to measure the token's attention to (repeatable; pieces summed; every occurrence, "
        "or WORD:N for the N-th).",
    ),
]
SortOpt = Annotated[
    str | None,
    typer.Option(
        "--sort",
        "-s",
        help="weight (first --target, else top weight) | entropy (most focused first) | sink | distance | "
        "delta (largest change, with --vs) [default: delta with --vs, else weight].",
        show_default=False,
    ),
]


PAIRS_LIMIT = 5  # heads shown per pair with --pairs, unless --limit says otherwise


@app.command()
def compare(
    sentence: Annotated[
        str | None, typer.Argument(help="The sentence to run through the model.", show_default=False)
    ] = None,
    token: TokenOpt = None,
    target: TargetOpt = None,
    vs: Annotated[
        str | None,
        typer.Option("--vs", help="A second sentence (a minimal pair): per head, the change in each target's weight."),
    ] = None,
    pairs: Annotated[
        Path | None,
        typer.Option(
            "--pairs",
            help="Run every pair of a tab-separated file (sentence_a, sentence_b, token, targets), "
            f"e.g. samples/minimal_pairs.tsv; {PAIRS_LIMIT} heads each unless --limit.",
            show_default=False,
        ),
    ] = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    top: Annotated[int, typer.Option("--top", "-k", min=1, help="How many strongest targets to list per head.")] = 3,
    sort: SortOpt = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Show only the first N heads.")] = None,
    layer: LayerOpt = "all",
    model: ModelOpt = None,
    engine: EngineOpt = "own",
    device: DeviceOpt = "auto",
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Rank the heads by what one token does: top targets, weight on --target words,
    entropy, sink, self/prev/next shares, distance; with --vs, the change between two sentences.

    Example: attnviz compare "The animal didn't cross the street because it was too tired" --token it --target animal
    """
    with errors(debug):
        from .metrics import SORT_KEYS, sort_rows

        targets = list(target or [])
        # Cheap checks first: none of these needs the model.
        if sort is not None and sort not in SORT_KEYS:
            raise UsageError(f"cannot sort by {sort!r}", hint="use --sort " + "|".join(SORT_KEYS))
        if pairs is not None:
            if sentence is not None or vs is not None or token is not None or targets or index is not None:
                raise UsageError(
                    "--pairs takes the sentences, token and targets from the file",
                    hint="drop the sentence, --vs, --token, --target and --index",
                )
            _compare_pairs(pairs, occurrence, top, sort, limit, layer, model, engine, device, json_out)
            return
        if sentence is None:
            raise UsageError("give a sentence (or --pairs FILE)", hint=f'e.g. attnviz compare "{EXAMPLE}" --token it')
        if vs is not None:
            if index is not None:
                raise UsageError("--vs aligns the token by its text", hint="use --token WORD instead of --index")
            if not targets:
                raise UsageError("--vs compares the weight on --target words", hint="add --target WORD (repeatable)")
            if not vs.strip():
                raise UsageError("the --vs sentence is empty", hint="give the second sentence of the pair")
        elif sort == "delta":
            raise UsageError("--sort delta needs two sentences", hint="add --vs SENTENCE, or sort by weight")
        eng, tokens, queries = prepare(sentence, model, engine, device, token, occurrence, index)
        if vs is None:
            from .engines import inspect
            from .metrics import find_targets, head_table

            find_targets(tokens, targets)  # a missing target fails before the forward pass
            att = inspect(tokens, eng, layer, queries)
            rows = sort_rows(head_table(att, queries, targets, top), sort, limit)
        else:
            assert token is not None  # prepare() needs --token or --index, and --index was refused
            att, queries, rows = _pair_rows(eng, tokens, queries, vs, token, occurrence, targets, top, layer)
            rows = sort_rows(rows, sort, limit)
        if json_out:
            typer.echo(_compare_json(rows))
            return
        _render_compare(stdout_console(), att, queries, rows, sort, vs is not None)


def _pair_rows(
    eng: Engine,
    tokens: Tokens,
    queries: tuple[int, ...],
    vs: str,
    token: str,
    occurrence: int | None,
    targets: list[str],
    top: int,
    layer: str,
) -> tuple[Any, tuple[int, ...], list[dict[str, Any]]]:
    """Both sentences of a minimal pair through one loaded engine -> (A's Attention,
    A's query positions, unsorted pair rows). Token and targets are found by text in each."""
    from .engines import inspect
    from .metrics import find_targets, pair_table
    from .tokens import find_word

    find_targets(tokens, targets)
    tokens_vs = eng.tokenize(vs)
    try:
        queries_vs = find_word(tokens_vs, token, occurrence)
    except UsageError as exc:
        raise type(exc)(exc.message.replace("the sentence", "the --vs sentence"), exc.hint) from None
    find_targets(tokens_vs, targets, where="the --vs sentence")
    att = inspect(tokens, eng, layer, queries)
    att_vs = inspect(tokens_vs, eng, layer, queries_vs)
    return att, queries, pair_table(att, queries, att_vs, queries_vs, targets, top)


def _compare_pairs(
    path: Path,
    occurrence: int | None,
    top: int,
    sort: str | None,
    limit: int | None,
    layer: str,
    model: str | None,
    engine: str,
    device: str,
    json_out: bool,
) -> None:
    """Every pair of a minimal-pairs file through one loaded engine."""
    from .engines import load_engine
    from .metrics import sort_rows
    from .pairs import read_pairs
    from .tokens import find_word

    found = read_pairs(path)  # a bad file fails before the model loads
    eng = load_engine(engine, model, device)
    limit = PAIRS_LIMIT if limit is None else limit
    everything: list[dict[str, Any]] = []
    console = None if json_out else stdout_console()
    for n, pair in enumerate(found, start=1):
        where = f"{path}:{pair.line}"
        try:
            tokens = eng.tokenize(pair.sentence_a)
            queries = find_word(tokens, pair.token, occurrence)
            att, queries, rows = _pair_rows(
                eng, tokens, queries, pair.sentence_b, pair.token, occurrence, list(pair.targets), top, layer
            )
        except UsageError as exc:
            raise type(exc)(f"{where}: {exc.message}", exc.hint) from None
        rows = sort_rows(rows, sort, limit)
        if console is None:
            everything += [
                {"pair": n, "sentence": pair.sentence_a, "sentence_vs": pair.sentence_b, "token": pair.token, **row}
                for row in rows
            ]
            continue
        from rich.text import Text

        indent = " " * len(f"{n}. ")
        console.print(Text(f"{n}. A: {pair.sentence_a}\n{indent}B: {pair.sentence_b}", style="bold"))
        _render_compare(console, att, queries, rows, sort, True, header=n == 1)
        console.print()
    if json_out:
        typer.echo(_compare_json(everything))


def _compare_json(rows: Sequence[Any]) -> str:
    def rounded(value: Any) -> Any:
        # Six decimals keep float32's precision (as in Attention.to_json).
        if isinstance(value, float):
            return round(value, 6)
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    return json.dumps([rounded(row) for row in rows], ensure_ascii=False)


def _render_compare(
    console: Console,
    att: Any,
    queries: Sequence[int],
    rows: Sequence[Any],
    sort: str | None,
    pair: bool,
    header: bool = True,
) -> None:
    from rich.text import Text

    from .render.tables import head_rows_table, pair_rows_table

    # NO_COLOR keeps rich's colour system but strips colours: render the plain variant.
    color = console.color_system is not None and not console.no_color
    p = att.provenance
    if header:
        console.print(
            Text(f"{p.model} · engine {p.engine} · {p.device} · {p.num_layers} layers × {p.num_heads} heads"),
            style="dim",
        )
    word = " ".join(att.tokens.labels[q] for q in queries)
    if len(queries) > 1:
        console.print(Text(f"{word!r} is split into {len(queries)} tokens: its row is their mean", style="dim"))
    shown = f"{len(rows)} heads" if len(rows) < len(att.layers) * p.num_heads else "every head"
    kv = {"num_heads": p.num_heads, "num_kv_heads": p.num_kv_heads, "width": console.width}
    if pair:
        title = f"{word!r}: weight on each target in sentence A and B, Δ = B − A, {shown}, largest change first"
        if sort not in (None, "delta"):
            title = title.rsplit(",", 1)[0] + f", sorted by {sort}"
        console.print(pair_rows_table(rows, title=title, color=color, **kv))
        return
    by = sort or "weight"
    title = f"{word!r} → each token, {shown}, sorted by {by}"
    console.print(head_rows_table(rows, sort_by=by, title=title, color=color, **kv))


@app.command()
def check(
    model: ModelOpt = None,
    sentence: Annotated[
        list[str] | None, typer.Option("--sentence", "-s", help="Also compare on this sentence (repeatable).")
    ] = None,
    device: DeviceOpt = "auto",
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Prove our multi-head attention exact on a model: run --engine own and transformers
    on a few sentences and print, per layer, the largest difference of the attention
    weights (exit status 1 if any exceeds 1e-5)."""
    with errors(debug):
        from .check import DEFAULT_SENTENCES, compare_engines

        sentences = (*DEFAULT_SENTENCES, *(sentence or ()))
        err = stderr_console()
        if err.is_terminal:  # progress is for people watching, not for logs
            err.print(f"comparing --engine own with transformers on {len(sentences)} sentences...", style="dim")
        result = compare_engines(model, sentences, device)
        if json_out:
            typer.echo(json.dumps(result.to_dict(), ensure_ascii=False))
        else:
            from .render.check_table import render_check

            stdout_console().print(render_check(result))
    raise typer.Exit(0 if result.passed else 1)


def _show_json(att: Any, queries: Sequence[int]) -> str:
    out = att.to_dict(queries[0])
    out["query_indices"] = list(queries)
    if len(queries) > 1:
        # A word split into pieces: every piece's rows, in order.
        out["pieces_weights"] = [att.to_dict(q)["weights"] for q in queries]
    return json.dumps(out, ensure_ascii=False)


# Registers ``attnviz heads`` on ``app`` (imports nothing heavy).
from . import cli_heads  # noqa: E402, F401


def main() -> None:
    """Console-script entry point."""
    app()
