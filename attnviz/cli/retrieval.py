"""``attnviz heads --probe retrieval``: the options checked before any model work, the
probe run with a progress bar (here or on Ray), the table or JSON printed. The prompts and
the scoring live in attnviz.corpus.needles and attnviz.measures.retrieval."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import ExitCode, UsageError

if TYPE_CHECKING:
    from ..corpus.needles import NeedleSpec
    from ..engines import Engine
    from ..measures.retrieval import RetrievalReport

LengthsOpt = Annotated[
    str,
    typer.Option(
        "--lengths", metavar="1k,4k,...", help="--probe retrieval: prompt lengths in tokens (k = 1,024 tokens)."
    ),
]
DepthsOpt = Annotated[
    str,
    typer.Option("--depths", metavar="0,0.5,1", help="--probe retrieval: where the needle sits, 0 (start) to 1 (end)."),
]
NeedleLengthOpt = Annotated[
    int, typer.Option("--needle-length", metavar="N", help="--probe retrieval: the needle's tokens (vocabulary).")
]
NeedleFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--needle-file",
        metavar="PATH",
        help='--probe retrieval: JSON {"haystack", "needle", "question"} texts instead of vocabulary tokens.',
        show_default=False,
    ),
]
DEFAULT_LENGTHS, DEFAULT_DEPTHS = "1k,4k", "0,0.25,0.5,0.75,1"


@dataclass(frozen=True)
class RetrievalArgs:
    """The retrieval probe's own options, as given."""

    lengths: str = DEFAULT_LENGTHS
    depths: str = DEFAULT_DEPTHS
    needle_length: int = 8
    needle_file: Path | None = None
    seed: int = 0

    def given(self) -> bool:
        """Whether any was changed from its default (they apply to --probe retrieval alone)."""
        return self != RetrievalArgs(seed=self.seed)


def check(args: RetrievalArgs, model: str | None, *, refused: dict[str, bool]) -> NeedleSpec:
    """Everything knowable before loading the model: the lists, the options that do not
    apply, the file, and each length plus the written needle against the config's positions."""
    from ..corpus.needles import NeedleSpec, within_positions
    from ..io.models import resolve
    from ..measures.retrieval import parse_depths, parse_lengths

    clash = [name for name, on in refused.items() if on]
    if clash:
        raise UsageError(f"{', '.join(clash)} cannot be combined with --probe retrieval", hint="drop it")
    try:
        lengths = parse_lengths(args.lengths)
    except ValueError as exc:
        raise UsageError(f"--lengths {args.lengths!r}: {exc}", hint="e.g. --lengths 1k,4k,32k or 512,2048") from None
    try:
        depths = parse_depths(args.depths)
    except ValueError as exc:
        raise UsageError(f"--depths {args.depths!r}: {exc}", hint="e.g. --depths 0,0.25,0.5,0.75,1") from None
    if args.needle_length < 1:
        raise UsageError(f"--needle-length {args.needle_length}: a needle needs a token", hint="e.g. 8")
    if args.needle_file is not None and not args.needle_file.is_file():
        raise UsageError(f"--needle-file {str(args.needle_file)!r} is not a file", hint="check the path")
    spec = NeedleSpec(lengths, depths, args.needle_length, args.seed, args.needle_file)
    try:
        within_positions(spec, resolve(model).config)
    except UsageError as exc:
        raise UsageError(f"--lengths {args.lengths}: {exc.message}", hint=exc.hint) from None
    return spec


def run(
    eng: Engine, spec: NeedleSpec, layers: tuple[int, ...], where: str | None, quiet: bool, worker: dict[str, Any]
) -> RetrievalReport:
    """The probe, with a progress bar of cases on a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..corpus.needles import run_probe
    from .common import stderr_console

    progress = Progress(
        TextColumn("retrieval"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("cases"),
        TimeRemainingColumn(),
        console=stderr_console(),
        disable=quiet,
        transient=True,
    )
    task = progress.add_task("retrieval", total=len(spec.lengths) * len(spec.depths))
    with progress:
        return run_probe(eng, spec, layers, lambda n: progress.update(task, advance=n), where, worker)


def probe_heads(
    eng: Engine, spec: NeedleSpec, layers: tuple[int, ...], where: str | None, json_out: bool, top: int, worker: Any
) -> None:
    """Run, then print the table (or JSON); a partial run ends 130 after printing."""
    from ..corpus.needles import check_model
    from ..engines import engine_provenance

    try:
        check_model(eng, spec)
    except UsageError as exc:
        raise UsageError(f"--probe retrieval: {exc.message}", hint=exc.hint) from None
    started = time.perf_counter()
    report = run(eng, spec, layers, where, json_out or not sys.stderr.isatty(), worker)
    report.seconds = time.perf_counter() - started
    provenance = engine_provenance(eng)
    if report.cases == 0 and report.partial:
        raise KeyboardInterrupt
    if json_out:
        from .output import emit_json

        emit_json({"provenance": provenance.to_dict(), **report.to_dict()})
    else:
        from ..render.terminal import uses_colour
        from ..render.terminal.retrieval import retrieval_view
        from .common import stdout_console

        console = stdout_console()
        console.print(retrieval_view(report, provenance, top=top, color=uses_colour(console)))
    if report.partial:
        sys.stderr.write(f"attnviz: interrupted: the results cover {report.cases} cases (partial)\n")
        raise SystemExit(ExitCode.INTERRUPTED)
