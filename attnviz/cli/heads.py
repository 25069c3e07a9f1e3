"""``attnviz heads``: what each head does across a corpus (detectors, coreference).

Parses options, reads the corpus through attnviz.corpus, runs the scan (here or on Ray),
renders. No scoring logic here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import ExitCode, Reason, UsageError
from ..render import DEFAULT_DPI, IMAGE_FORMATS
from .app import app, errors
from .common import stderr_console, stdout_console, wrote
from .conventions import example
from .groups import Ablation, ModelChoice, grouped
from .options import DEFAULT_MEASURE, DebugOpt, DType, EngineName, LayerOpt, MeasureOpt
from .retrieval import (
    DEFAULT_DEPTHS,
    DEFAULT_LENGTHS,
    DepthsOpt,
    LengthsOpt,
    NeedleFileOpt,
    NeedleLengthOpt,
    RetrievalArgs,
    probe_heads,
)

MAX_PASSES = 20_000  # heads --ablate runs past this many forward passes only with --yes

if TYPE_CHECKING:
    from ..corpus.needles import NeedleSpec
    from ..corpus.scan import ScanReport
    from ..corpus.sources import CorpusText


@app.command(epilog=example("attnviz heads --probe induction --probe-texts 20 --top 5"))
@grouped(
    layout="corpus fmt probe probe_texts probe_length seed lengths depths needle_length needle_file pairs model "
    "engine layer device dtype batch_size truncate "
    "local_k top output dpi json_out csv_out ray ray_address measure ablate ablate_with query_rule max_passes yes "
    "max_memory debug"
)
def heads(
    *,
    corpus: Annotated[
        str | None,
        typer.Argument(
            metavar="CORPUS",
            help="Text file (one text per line), JSONL with a 'text' field, or - for stdin.",
            show_default=False,
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", metavar="auto|text|jsonl", help="Corpus format: auto (by suffix), text or jsonl.")
    ] = "auto",
    probe: Annotated[
        str | None,
        typer.Option(
            "--probe",
            metavar="induction|retrieval",
            help="Built-in probe instead of a corpus: induction (repeated random tokens) or retrieval "
            "(needles in haystacks, generated back; Wu et al. 2024).",
            show_default=False,
        ),
    ] = None,
    probe_texts: Annotated[int, typer.Option("--probe-texts", metavar="N", min=1, help="Texts in the probe.")] = 200,
    probe_length: Annotated[
        int, typer.Option("--probe-length", metavar="N", min=1, help="Random tokens, repeated twice.")
    ] = 20,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the probe's random tokens.")] = 0,
    lengths: LengthsOpt = DEFAULT_LENGTHS,
    depths: DepthsOpt = DEFAULT_DEPTHS,
    needle_length: NeedleLengthOpt = 8,
    needle_file: NeedleFileOpt = None,
    pairs: Annotated[
        Path | None,
        typer.Option(
            "--pairs",
            metavar="PATH",
            help="Coreference examples: a minimal-pairs TSV or JSONL of text, pronoun, referent, candidates.",
            show_default=False,
        ),
    ] = None,
    model: ModelChoice,
    layer: LayerOpt = "all",
    batch_size: Annotated[
        int, typer.Option("--batch-size", "-b", metavar="N", min=1, help="Texts per forward pass.")
    ] = 16,
    truncate: Annotated[
        bool, typer.Option("--truncate", help="Cut texts longer than the model's positions instead of skipping them.")
    ] = False,
    local_k: Annotated[
        int, typer.Option("--local-k", metavar="K", min=0, help="The local detector's window: ±k tokens.")
    ] = 2,
    top: Annotated[int, typer.Option("--top", metavar="N", min=1, max=12, help="Heads shown per detector.")] = 3,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", metavar="PATH", help="Also draw one layers × heads panel per detector (.png, .svg, .pdf)."
        ),
    ] = None,
    dpi: Annotated[int, typer.Option("--dpi", metavar="N", help="Pixels per inch of -o.")] = DEFAULT_DPI,
    json_out: Annotated[bool, typer.Option("--json", help="Print every (layer, head, detector) row as JSON.")] = False,
    csv_out: Annotated[bool, typer.Option("--csv", help="Print every (layer, head, detector) row as CSV.")] = False,
    ray: Annotated[
        bool, typer.Option("--ray", help="Run the batches on Ray (a local instance unless --ray-address).")
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            metavar="ADDRESS",
            help="Ray cluster to run on (auto, ray://HEAD:10001); implies --ray.",
            show_default=False,
        ),
    ] = None,
    measure: MeasureOpt = DEFAULT_MEASURE,
    ablation: Ablation,
    query_rule: Annotated[
        str,
        typer.Option(
            "--query-rule",
            metavar="all|last",
            help="With --ablate: the effect at every real token (all) or at each text's last one (last, decoders).",
        ),
    ] = "all",
    max_passes: Annotated[
        int,
        typer.Option(
            "--max-passes", metavar="N", min=1, help="With --ablate: refuse a corpus that takes more forward passes."
        ),
    ] = MAX_PASSES,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Run an --ablate scan past --max-passes.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Score every head over a corpus: previous-token, induction, sink and other detectors."""
    with errors(debug):
        # 1. Cheap checks, before any model work.
        _check_sources(corpus, fmt, probe, pairs, json_out, csv_out, output)
        needles = _retrieval(
            probe, RetrievalArgs(lengths, depths, needle_length, needle_file, seed), model.model, locals()
        )
        if ablation.mode is not None:
            _check_ablation(corpus, probe, probe_texts, pairs, model.model, query_rule, ablation.mode, max_passes, yes)
        limit = model.budget()
        if ray_address not in (None, "local", "auto"):
            from ..corpus.distributed import reach

            reach(ray_address)  # nothing listening: one line now, not a wait after the model load
        from ..analyses import corpus_means, corpus_texts
        from ..corpus.detectors import DetectorConfig
        from ..engines import engine_provenance, load_engine
        from ..select import parse_layers

        # 2. The model.
        engine_name, dtype_name = EngineName(model.engine).value, DType(model.dtype).value
        eng = load_engine(engine_name, model.model, model.device, dtype_name)
        chosen = parse_layers(layer, eng.num_layers, eng.shape.attention_layers)
        where = ray_address if ray_address is not None else "local" if ray else None
        if needles is not None:
            worker = {"model": model.model, "engine": engine_name, "dtype": dtype_name}
            return probe_heads(eng, needles, tuple(chosen), where, json_out, top, worker)
        from ..corpus.scan import ScanOptions

        options = ScanOptions(
            layers=chosen,
            batch_size=batch_size,
            truncate=truncate,
            config=DetectorConfig(local_k=local_k),
            measure=measure.value,
            ablate=ablation.mode,
            query_rule=query_rule,
            max_memory=limit,
        )
        items, total = corpus_texts(eng, corpus, fmt, probe, probe_texts, probe_length, seed, pairs)
        if ablation.mode == "mean":
            items, options = corpus_means(eng, items, options)
        # 3. The scan, with a progress bar on a terminal only.
        quiet = json_out or csv_out or not sys.stderr.isatty()
        report = _scan(eng, items, total, options, where, quiet, model.model, engine_name, model.device, dtype_name)
        # 4. Results: whole, even after Ctrl-C (marked partial).
        provenance = engine_provenance(eng)
        _notes(report, eng)
        if report.texts == 0 and report.partial:
            from ..io.safeio import terminated_by

            raise terminated_by() or KeyboardInterrupt()  # SIGTERM/SIGHUP keep their exit code
        if output is not None:
            from ..render.image import save_figure
            from ..render.image.heads import heads_figure

            missing = save_figure(heads_figure(report, provenance, measure=measure.value), output, dpi)
        _print(report, provenance, measure.value, json_out, csv_out, top)
        if output is not None and not (json_out or csv_out):
            wrote(output, missing)
        if report.partial:
            from ..io.safeio import terminated_by

            signalled = terminated_by()  # SIGTERM and SIGHUP end 143 and 129, Ctrl-C 130
            how = f"terminated by {signalled.name}" if signalled else "interrupted"
            sys.stderr.write(f"attnviz: {how}: the results cover the first {report.texts} texts (partial)\n")
            raise SystemExit(signalled.exit_code if signalled else ExitCode.INTERRUPTED)


def _retrieval(probe: str | None, args: RetrievalArgs, model: str | None, given: dict[str, Any]) -> NeedleSpec | None:
    """--probe retrieval's spec, checked before any model work; None for the other sources
    (which refuse the retrieval options)."""
    from .retrieval import check

    if probe != "retrieval":
        if args.given():
            raise UsageError(
                "--lengths, --depths, --needle-length and --needle-file belong to --probe retrieval",
                hint="add --probe retrieval, or drop them",
            )
        return None
    refused = {
        "--ablate": given["ablation"].mode is not None,
        "--csv": given["csv_out"],
        "-o/--output": given["output"] is not None,
        "--measure norm": given["measure"] != DEFAULT_MEASURE,
        "--truncate": given["truncate"],
    }
    return check(args, model, refused=refused)


def _check_sources(
    corpus: str | None,
    fmt: str,
    probe: str | None,
    pairs: Path | None,
    json_out: bool,
    csv_out: bool,
    output: Path | None,
) -> None:
    """The texts to scan and the outputs, checked before any model work."""
    from ..corpus.sources import PROBES, corpus_format
    from ..result import check_writable

    if corpus is not None and probe is not None:
        raise UsageError("give a corpus or --probe, not both", hint="drop the corpus argument or --probe")
    if corpus is None and probe is None and pairs is None:
        raise UsageError("no texts to scan", hint="give a corpus file (- for stdin), --probe induction or --pairs")
    if probe is not None and probe not in PROBES:
        raise UsageError(f"unknown probe {probe!r}", hint="use --probe " + " or ".join(PROBES))
    if json_out and csv_out:
        raise UsageError("--json and --csv both print on stdout", hint="pick one")
    if corpus is not None:
        corpus_format(corpus, fmt)
    if output is not None:
        check_writable(output, IMAGE_FORMATS)


def _print(report: ScanReport, provenance: Any, measure: str, json_out: bool, csv_out: bool, top: int) -> None:
    """The scan's answer on stdout: JSON (``analyses.HeadScan.to_dict``), CSV or the table."""
    if json_out:
        from ..analyses import HeadScan
        from .output import emit_json

        emit_json(HeadScan(report, provenance, measure).to_dict())
    elif csv_out:
        from ..corpus.scan import report_csv
        from .output import emit

        emit(report_csv(report), nl=False)
    else:
        from ..render.terminal import uses_colour
        from ..render.terminal.heads import heads_table

        console = stdout_console()
        console.print(heads_table(report, provenance, top=top, color=uses_colour(console), measure=measure))


def _check_ablation(
    corpus: str | None,
    probe: str | None,
    probe_texts: int,
    pairs: Path | None,
    model: str | None,
    rule: str,
    mode: str,
    max_passes: int,
    yes: bool,
) -> None:
    """--ablate's checks before any model work: the query rule, no --pairs, and the corpus's
    forward passes (from config.json and the corpus's line count) within --max-passes."""
    from ..architectures.base import config_value
    from ..corpus.sources import count_lines
    from ..io.models import resolve
    from ..measures.ablation import QUERY_RULES, corpus_passes

    if rule not in QUERY_RULES:
        raise UsageError(f"unknown query rule {rule!r}", hint="use --query-rule all or --query-rule last")
    if pairs is not None:
        raise UsageError("--ablate scores the heads over a corpus's tokens", hint="drop --pairs")
    texts = probe_texts if probe is not None else count_lines(corpus) if corpus not in (None, "-") else None
    if texts is None:
        return  # standard input: not countable before reading it
    config = resolve(model).config
    layers = int(config_value(config, "num_hidden_layers", "n_layer", "num_layers", default=0))
    heads = int(config_value(config, "num_attention_heads", "n_head", "num_heads", default=0))
    need = corpus_passes(texts, layers, heads, mode)
    if need > max_passes and not yes:
        raise UsageError(
            f"heads --ablate on {texts} texts takes {need} forward passes ({need // max(texts, 1)} a text), "
            f"over --max-passes {max_passes}",
            hint="add --yes to run it anyway, raise --max-passes, or scan fewer texts",
            reason=Reason.ABLATION_BUDGET,
        )


def _scan(
    eng: Any,
    items: Iterator[CorpusText],
    total: int | None,
    options: Any,
    ray: str | None,
    quiet: bool,
    model: str | None,
    engine: str,
    device: str,
    dtype: str,
) -> ScanReport:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..corpus.scan import Scan

    progress = Progress(
        TextColumn("scanning"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} texts/s"),
        TimeRemainingColumn(),
        console=stderr_console(),
        disable=quiet,
        transient=True,
    )
    task = progress.add_task("scan", total=total, rate="-")
    started = time.perf_counter()
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        rate = done / max(time.perf_counter() - started, 1e-9)
        progress.update(task, advance=n, rate=f"{rate:.1f}")

    with progress:
        if ray is not None:
            from ..corpus.distributed import RayScan

            address = None if ray == "local" else ray
            runner = RayScan(eng, options, address, model=model, engine_name=engine, device=device, dtype=dtype)
            try:
                return runner.run(items, advance)
            except KeyboardInterrupt:
                return runner.report(partial=True)
        scan = Scan(eng, options)
        try:
            return scan.run(items, advance)
        except KeyboardInterrupt:
            return scan.report(partial=True)


def _notes(report: ScanReport, eng: Any) -> None:
    """Skipped and truncated texts, one stderr line each."""
    if report.skipped:
        where = ", ".join(report.skipped_where) + (", ..." if report.skipped > len(report.skipped_where) else "")
        sys.stderr.write(
            f"attnviz: skipped {report.skipped} text(s) longer than the model's {eng.max_positions} positions "
            f"({where}); --truncate cuts them instead\n"
        )
    if report.truncated:
        sys.stderr.write(f"attnviz: truncated {report.truncated} text(s) to {eng.max_positions} tokens\n")
