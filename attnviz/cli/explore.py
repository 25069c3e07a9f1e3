"""attnviz explore: the terminal explorer over one loaded model (textual, in attnviz.tui)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..measures.base import NORM
from ..render import DEFAULT_DPI
from .app import EXAMPLE, app, errors
from .common import load, query_from
from .conventions import example
from .generating import SeedOpt
from .groups import Generating, grouped
from .options import DebugOpt, DeviceOpt, EngineName, EngineOpt, LayerOpt, ModelOpt, Occurrence, Sentence

StartTokenOpt = Annotated[
    str | None, typer.Option("--token", "-t", metavar="WORD", help="Word to start on (default: the first word).")
]
StartIndexOpt = Annotated[
    int | None, typer.Option("--index", "-i", metavar="K", help="Raw token position to start on (0-based).")
]
ExportDirOpt = Annotated[
    Path,
    typer.Option(
        "--export-dir", metavar="DIR", help="Where the e key writes PNG files [default: .].", show_default=False
    ),
]


@app.command(epilog=example(f'attnviz explore "{EXAMPLE}" --token it'))
@grouped(
    layout="sentence token occurrence index model engine layer device generate sample temperature top_p seed "
    "export_dir debug"
)
def explore(
    *,
    sentence: Sentence,
    token: StartTokenOpt = None,
    occurrence: Occurrence = None,
    index: StartIndexOpt = None,
    model: ModelOpt = None,
    engine: EngineOpt = EngineName.own,
    layer: LayerOpt = "all",
    device: DeviceOpt = "auto",
    generation: Generating,
    seed: SeedOpt = None,
    export_dir: ExportDirOpt = Path("."),
    debug: DebugOpt = False,
) -> None:
    """Explore a sentence's attention in the terminal: the model loads once, then keys move
    the token (←/→), the layer (↑/↓) and the head (the bracket keys), switch views (v), run a
    new sentence (/), export the view to PNG (e), rank the layer's heads by ablation (a), explain
    the head under the cursor (x); ? lists every key, q quits.

    --generate N: a decoder first writes up to N tokens, and the explorer opens on the prompt
    and what it wrote (written tokens marked «like this»), on the first written token.
    """
    with errors(debug):
        from ..errors import Reason, UsageError

        # Everything a user can get wrong without a model, before loading one.
        sampling = generation.check(seed)
        if not (sys.stdin is not None and sys.stdout is not None and sys.stdin.isatty() and sys.stdout.isatty()):
            raise UsageError(
                "attnviz explore is interactive and needs a terminal",
                hint="for a pipe or a file use attnviz show, compare or export",
            )
        if not os.path.isdir(export_dir):  # False for any OSError (Path.is_dir raised ENAMETOOLONG)
            raise UsageError(f"--export-dir {str(export_dir)!r} is not a directory", hint="create it first")
        query = query_from(token, occurrence, index, required=False)
        eng = load(sentence, model, engine.value, device)

        from ..pipeline import Selection
        from ..tui.app import ExploreApp
        from .exploring import ablater, explainer, explore_reading, generated, long_reading, runner

        selection = Selection(queries=() if query is None else (query,), layers=layer)
        text, selection = generated(eng, sentence, selection, generation, sampling)
        rows = None
        try:
            try:
                first = explore_reading(eng, text, selection)
            except UsageError as exc:
                if exc.reason is not Reason.EXPLORE_SIZE:
                    raise
                # A long text: the rows of a few tokens at a time, drawn as compact rows.
                first, rows = long_reading(eng, text, selection)
        except UsageError as exc:
            if exc.reason is not Reason.EXPLORE_SIZE:
                raise
            raise UsageError(exc.message, hint="pick layers with --layer N or A-B, or shorten the sentence") from None
        att = first.attention
        start = first.queries[0] if query is not None else None
        run = runner(eng, att.layers)
        run_norms = runner(eng, att.layers, measure=NORM.name)
        explorer = ExploreApp(
            att,
            run,
            query=start,
            export_dir=export_dir,
            dpi=DEFAULT_DPI,
            run_norms=run_norms,
            rows=rows,
            ablate=ablater(eng, att.layers),
            explain=explainer(eng),
        )
        if "transformers" in sys.modules:
            # Its log handler holds the real stderr, past textual's capture: a warning during a
            # forward pass (--engine hf) would be written across the screen.
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
        code = _run(explorer)
        if code:  # textual has printed what went wrong, or _run has
            raise typer.Exit(code)


HANGUP_POLL_S = 0.5  # how often the terminal is checked for being gone
FORCED_EXIT_S = 3.0  # a session that has not ended this long after a signal is ended


def _run(explorer: object) -> int:
    """``explorer.run()`` ending with the exit codes of every command: 130 on SIGINT,
    143 on SIGTERM, 129 on SIGHUP or when the terminal goes away without one (a shell
    that ignores SIGHUP sends none: textual then spun at 80% of a CPU, issue 25).

    The handlers only note the signal; a watcher thread asks the app to exit (textual
    restores the terminal if it is still there) and ends the process itself if that has
    not happened ``FORCED_EXIT_S`` later (a terminal that is gone can block the restore).
    """
    import signal
    import termios
    import threading

    from ..io.safeio import one_line

    app: Any = explorer
    got: list[int] = []
    stop = threading.Event()

    def note(signum: int, frame: object) -> None:
        got.append(signum)
        stop.set()

    fd = sys.stdin.fileno()

    def gone() -> bool:
        try:
            termios.tcgetattr(fd)  # EIO once the terminal has hung up
        except (termios.error, OSError, ValueError):
            return True
        return False

    def watch() -> None:
        while not stop.wait(HANGUP_POLL_S):
            if gone():
                got.append(signal.SIGHUP)
                stop.set()
        if not got:
            return  # the session ended by itself
        code = _code(got[0])
        threading.Timer(FORCED_EXIT_S, os._exit, (code,)).start()
        with contextlib.suppress(Exception):  # the app may be ending already
            app.call_from_thread(app.exit, return_code=code)

    names = ("SIGINT", "SIGTERM", "SIGHUP")
    signals = [getattr(signal, n) for n in names if hasattr(signal, n)]
    previous = {sig: signal.signal(sig, note) for sig in signals}
    watcher = threading.Thread(target=watch, name="attnviz-hangup", daemon=True)
    watcher.start()
    try:
        app.run()
    finally:
        stop.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not got and gone():
        # textual's driver met the lost terminal (EIO) and ended the app before the watcher's
        # next look: the same hang-up, not an error of the app's.
        got.append(signal.SIGHUP)
    if not got:
        return int(app.return_code or 0)
    code = _code(got[0])
    how = "interrupted" if got[0] == signal.SIGINT else f"terminated by {signal.Signals(got[0]).name}"
    with contextlib.suppress(OSError, ValueError):  # no terminal left to say it on
        sys.stderr.write(one_line(f"attnviz: error: {how}") + "\n")
        sys.stderr.flush()
    return code


def _code(signum: int) -> int:
    import signal

    return 130 if signum == signal.SIGINT else 128 + signum
