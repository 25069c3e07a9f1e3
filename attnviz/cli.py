"""The ``attnviz`` command line: parse options, call the library, render, map errors.

Thin by design: no math and no model code here. Heavy imports (torch, transformers,
matplotlib) happen inside the commands, so ``attnviz --help`` stays fast.

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or input, 130 interrupted.
Results go to stdout; errors and diagnostics to stderr, one line each.
"""

from __future__ import annotations

import contextlib
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


def pick_queries(tokens: Tokens, token: str | None, occurrence: int | None, index: int | None) -> tuple[int, ...]:
    """The token positions the user asked for with --token/--occurrence or --index."""
    from .tokens import check_index, find_word

    if token is not None and index is not None:
        raise UsageError("give --token or --index, not both", hint="--token WORD picks by text, --index K by position")
    if token is not None:
        return find_word(tokens, token, occurrence)
    if index is not None:
        if occurrence is not None:
            raise UsageError("--occurrence goes with --token, not --index", hint="drop --occurrence")
        return (check_index(tokens, index),)
    raise UsageError("say which token to inspect", hint="add --token WORD (or --index K)")


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
    from .engines import ENGINES, load_engine

    if not sentence.strip():
        raise UsageError("the sentence is empty", hint=f'give some text, e.g. attnviz show "{EXAMPLE}" --token it')
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}", hint="use --engine own or --engine hf")
    if need_query and token is None and index is None:
        raise UsageError("say which token to inspect", hint="add --token WORD (or --index K)")
    eng = load_engine(engine, model, device)
    tokens = eng.tokenize(sentence)
    queries = pick_queries(tokens, token, occurrence, index) if need_query else ()
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
            _write_token_image(att, queries, png, DPI_DEFAULT)


DPI_DEFAULT = 150
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
        DPI_DEFAULT
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
        from .render import IMAGE_FORMATS
        from .result import check_writable

        # Everything a user can get wrong without a model is checked before loading one
        # (and before importing matplotlib).
        check_writable(output, IMAGE_FORMATS)
        if view not in ("token", "matrix"):
            raise UsageError(f"unknown view {view!r}", hint="use --view token or --view matrix")
        if view == "matrix" and layer is not None and layer.strip().lower() == "all":
            raise UsageError("the matrix view draws one layer", hint="give --layer N (default: the middle layer)")
        picked = token is not None or index is not None
        eng, tokens, queries = prepare(
            sentence, model, engine, device, token, occurrence, index, need_query=view == "token" or picked
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


def _show_json(att: Any, queries: Sequence[int]) -> str:
    import json

    out = att.to_dict(queries[0])
    out["query_indices"] = list(queries)
    if len(queries) > 1:
        # A word split into pieces: every piece's rows, in order.
        out["pieces_weights"] = [att.to_dict(q)["weights"] for q in queries]
    return json.dumps(out, ensure_ascii=False)


def main() -> None:
    """Console-script entry point."""
    app()
