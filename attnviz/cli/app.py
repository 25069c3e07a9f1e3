"""The ``attnviz`` typer app, and the mapping of library errors to one stderr line.

The command modules register themselves on ``app``; ``attnviz.cli`` imports them all.

Thin by design: no pipeline logic, no model code and no library error text here. The
library raises errors that carry facts and a reason; ``hints.hint_for`` adds the
command-line flags from one table. Each
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

from ..errors import AttnvizError, ExitCode
from ..version import __version__
from . import conventions, output
from .hints import EXAMPLE as EXAMPLE
from .hints import hint_for


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
        _check_completion_shell(sys.argv[1:] if argv is None else list(argv))
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
            from ..io.safeio import terminated_by

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


_COMPLETION_SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _check_completion_shell(argv: Sequence[str]) -> None:
    """--show-completion / --install-completion detect the shell from the parent processes;
    where none is found (a cron job, a container's exec) typer printed "Shell  not
    supported." and no way out. Refused here naming the explicit form instead."""
    flag = next((a for a in argv if a in ("--show-completion", "--install-completion")), None)
    if flag is None:
        return
    named = argv[argv.index(flag) + 1] if argv.index(flag) + 1 < len(argv) else None
    if flag == "--show-completion" and named in _COMPLETION_SHELLS:
        _show_completion(named)  # the shell named: no detection (sh -c, a Dockerfile's RUN)
    try:
        import shellingham

        name: str | None = shellingham.detect_shell()[0]
    except Exception:  # ShellDetectionFailure, or no /proc to read
        name = None
    if name in _COMPLETION_SHELLS:
        return
    what = "cannot tell which shell this is" if not name else f"the shell {name!r} has no completion script"
    fail(
        f"{flag}: {what}",
        "name the shell: _ATTNVIZ_COMPLETE=source_bash attnviz prints the script "
        "(or source_zsh, source_fish, source_powershell)",
        ExitCode.USAGE,
    )


def _show_completion(shell: str) -> NoReturn:
    """Print ``shell``'s completion script, as typer's --show-completion does for the shell
    it detects (typer reads no shell named after the flag while it can detect one)."""
    from typer._completion_shared import get_completion_script

    print(get_completion_script(prog_name="attnviz", complete_var="_ATTNVIZ_COMPLETE", shell=shell))
    raise SystemExit(ExitCode.OK)


def _check_argv(argv: Sequence[str]) -> None:
    """Invalid UTF-8 on the command line (Python decodes it to lone surrogates) is bad
    input, refused before anything else runs, with the argument's position."""
    from ..errors import UsageError
    from ..io.safeio import check_text

    for i, arg in enumerate(argv, start=1):
        try:
            check_text(arg, f"command-line argument {i}", blank_ok=True)
        except UsageError as exc:
            fail(exc.message, exc.hint, exc.exit_code)


def _interrupted(exc: KeyboardInterrupt) -> NoReturn:
    from ..io.safeio import Terminated, exit_code_for

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
    from ..io.safeio import one_line

    sys.stderr.write(one_line(line.replace("\n", " ")) + "\n")
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
        fail(exc.message, hint_for(exc), exc.exit_code)
    except KeyboardInterrupt as exc:  # Ctrl-C, and SIGTERM/SIGHUP as safeio.Terminated
        _interrupted(exc)
    except BrokenPipeError:
        _quiet_pipe()
    except (typer.Exit, SystemExit):
        raise
    except Exception as exc:
        from ..io.safeio import terminated_by

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
    model_name: str | None = typer.Option(
        None,
        "--model-name",
        envvar="ATTNVIZ_MODEL_NAME",
        metavar="NAME",
        help="What pages, images and JSON call the model (default: the Hub id or name typed, or the "
        "checkpoint directory's own name; never a local path).",
    ),
    provenance: str = typer.Option(
        "short",
        "--provenance",
        envvar="ATTNVIZ_PROVENANCE",
        metavar="[short|full]",
        help="full: outputs also carry the local path the weights were read from.",
    ),
) -> None:
    """See what each attention head of a transformer does with a token."""
    from ..io.models import MODEL_NAME_VAR, PROVENANCE_VAR

    if provenance not in ("short", "full"):
        raise typer.BadParameter(f"must be short or full, not {provenance!r}", param_hint="--provenance")
    # The library reads them where it writes a provenance (engines.base.engine_provenance).
    os.environ[PROVENANCE_VAR] = provenance
    if model_name is None:
        os.environ.pop(MODEL_NAME_VAR, None)  # nothing left from an earlier call in this process
    elif not model_name.strip():
        raise typer.BadParameter("must not be empty", param_hint="--model-name")
    else:
        os.environ[MODEL_NAME_VAR] = model_name


def main() -> None:
    """Console-script entry point.

    Once the answer is flushed the process ends with ``os._exit``: the interpreter's
    teardown of torch and transformers is work nobody waits for (measured: 1.30 -> 0.96 ×
    ``import torch`` for a whole ``attnviz show``, issue 8).
    """
    from ..io.safeio import handle_signals

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
