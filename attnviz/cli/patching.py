"""attnviz patch: which heads carry the difference between a clean and a corrupted prompt."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from ..example import EXAMPLE, EXAMPLE_PAIR
from .app import app, errors
from .common import budget, decoder_text, print_result, query_from, wrote
from .conventions import example
from .options import (
    DebugOpt,
    DeviceOpt,
    DType,
    DtypeOpt,
    EngineName,
    EngineOpt,
    IndexOpt,
    JsonOpt,
    LayerOpt,
    MaxMemoryOpt,
    ModelOpt,
    NoPagerOpt,
    Occurrence,
    PartOpt,
    TargetTextOpt,
    TokenOpt,
)
from .pathpatching import ReceiverOpt, SendersOpt, Through, ThroughOpt

CLEAN_EXAMPLE, CORRUPTED_EXAMPLE = EXAMPLE, EXAMPLE_PAIR


class Direction(str, Enum):
    denoise = "denoise"
    noise = "noise"


class Site(str, Enum):
    z = "z"
    resid_pre = "resid_pre"
    attn_out = "attn_out"
    mlp_out = "mlp_out"
    q = "q"
    k = "k"
    v = "v"
    pattern = "pattern"


class Method(str, Enum):
    exact = "exact"
    attribution = "attribution"
    both = "both"


class PatchMetric(str, Enum):
    logit_diff = "logit-diff"
    prob = "prob"
    logprob = "logprob"
    kl = "kl"
    hidden = "hidden"


@app.command(epilog=example(f'attnviz patch "{CLEAN_EXAMPLE}" "{CORRUPTED_EXAMPLE}" --token it'))
def patch(
    clean: Annotated[
        str | None,
        typer.Argument(metavar="CLEAN", help="The prompt that shows the behaviour.", show_default=False),
    ] = None,
    corrupted: Annotated[
        str | None,
        typer.Argument(
            metavar="[CORRUPTED]", help="The prompt that does not (not needed with --dla).", show_default=False
        ),
    ] = None,
    answer: Annotated[
        str | None,
        typer.Option(
            "--answer", metavar="TOKEN", help="The answer token (a causal LM's next token).", show_default=False
        ),
    ] = None,
    wrong: Annotated[
        str | None,
        typer.Option("--wrong", metavar="TOKEN", help="The wrong token, for --metric logit-diff.", show_default=False),
    ] = None,
    metric: Annotated[
        PatchMetric | None,
        typer.Option(
            "--metric",
            help="logit-diff (answer − wrong), prob or logprob (of the answer), kl (to the clean distribution), "
            "hidden (the final hidden state's restoration, for models without an LM head). "
            "[default: logit-diff with --answer and --wrong, prob with --answer, kl with an LM head, else hidden]",
            show_default=False,
        ),
    ] = None,
    direction: Annotated[
        Direction,
        typer.Option(
            "--direction",
            help="denoise: the corrupted run with one head's z from the clean run; "
            "noise: the clean run with one head's z from the corrupted run.",
        ),
    ] = Direction.denoise,
    site: Annotated[
        Site,
        typer.Option(
            "--site",
            help="What is patched: z (each head's output before W^O), resid_pre (the residual stream entering "
            "each layer), attn_out or mlp_out (what each layer's attention or MLP adds), or a head's q, k, v "
            "(per key/value head under grouped-query attention) or pattern alone.",
        ),
    ] = Site.z,
    by_position: Annotated[
        bool,
        typer.Option(
            "--by-position",
            help="Each matched position apart (heads × positions; with --site resid_pre: causal tracing).",
        ),
    ] = False,
    method: Annotated[
        Method,
        typer.Option(
            "--method",
            help="exact: one patched run per head; attribution: the linear estimate of every head from one "
            "backward pass (attribution patching); both: the estimate beside the exact effect, disagreements "
            "flagged.",
        ),
    ] = Method.exact,
    attribution: Annotated[
        bool, typer.Option("--attribution", help="The same as --method both.", show_default=False)
    ] = False,
    dla: Annotated[
        bool,
        typer.Option(
            "--dla",
            help="Direct logit attribution of CLEAN instead: each head's, MLP's, the embeddings' and the biases' "
            "direct contribution to logit(answer) − logit(wrong) through the final norm (its scale frozen), "
            "with the sum check, and the logit lens. Needs --answer, --wrong and a causal LM whose residual "
            "stream is a sum (pre-norm).",
        ),
    ] = False,
    lens_top: Annotated[
        int, typer.Option("--lens-top", metavar="K", min=1, help="With --dla: tokens per layer in the logit lens.")
    ] = 3,
    pairs: Annotated[
        Path | None,
        typer.Option(
            "--pairs",
            metavar="FILE",
            help="Patch every pair of a file instead (JSONL with clean, corrupted, answer, wrong; or a TSV with "
            "that header): each head's mean effect with a 95% bootstrap interval over the pairs.",
            show_default=False,
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option("--ray", help="With --pairs: patch the pairs on Ray (a local instance unless --ray-address)."),
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
    vs_model: Annotated[
        str | None,
        typer.Option(
            "--vs-model",
            metavar="DIR",
            help="A second checkpoint of the same architecture (base and fine-tuned): each head's change in its "
            "weight row, norm row, ablation effect and patching effect, on the prompt or --pairs.",
            show_default=False,
        ),
    ] = None,
    target_text: TargetTextOpt = None,
    part: PartOpt = None,
    receiver: ReceiverOpt = None,
    through: ThroughOpt = Through.q,
    senders: SendersOpt = None,
    token: TokenOpt = None,
    occurrence: Occurrence = None,
    index: IndexOpt = None,
    layer: LayerOpt = "all",
    top: Annotated[int, typer.Option("--top", metavar="K", min=1, help="Heads in the ranked table.")] = 10,
    model: ModelOpt = None,
    engine: EngineOpt = EngineName.own,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = DType.float32,
    max_memory: MaxMemoryOpt = None,
    json_out: JsonOpt = False,
    npz: Annotated[
        Path | None,
        typer.Option("--npz", metavar="PATH", help="Also write the effects and labels to an .npz file."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="PATH",
            help="Also draw the heatmap to a .png, .svg or .pdf, or write the HTML page (.html: the heatmap, "
            "the ranked table, the pair's alignment).",
            show_default=False,
        ),
    ] = None,
    no_pager: NoPagerOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Activation patching: for every head, run one prompt with that head's output (z, before
    W^O) taken from the other prompt's run, and score how much of the clean behaviour it
    restores (denoise) or destroys (noise): 0 = the corrupted run, 1 = the clean one.
    """
    with errors(debug):
        from ..errors import Reason, UsageError
        from ..io.safeio import check_text

        # Before any model work: the texts, the files, the token query, the metric's answers.
        if vs_model is not None or pairs is not None:  # one prompt against two models, or a file of pairs
            if attribution or method is not Method.exact:
                raise UsageError("--method and --attribution go with one pair, not --pairs or --vs-model",
                                 reason=Reason.PATCH_PAIR)  # fmt: skip
            _many(vs_model, pairs, clean, corrupted, answer, wrong, metric, direction, site, by_position, dla, layer,
                  query_from(token, occurrence, index, required=False), model, engine.value, device, dtype.value,
                  max_memory, ray, ray_address, {"npz": npz, "output": output, "json_out": json_out,
                  "no_pager": no_pager, "top": top})  # fmt: skip
            return
        if clean is None:
            raise UsageError("patch needs CLEAN and CORRUPTED, or --pairs FILE", reason=Reason.PATCH_PAIR)
        if ray or ray_address is not None:
            raise UsageError("--ray patches the pairs of --pairs FILE on Ray", reason=Reason.PATCH_PAIR)
        check_text(clean, "the clean text")
        if dla:
            _attribute(clean, corrupted, answer, wrong, token, occurrence, index, lens_top, top,
                       model, engine.value, device, dtype.value, json_out, no_pager)  # fmt: skip
            return
        pair = _check_pair(corrupted, answer, wrong, metric, npz, output)
        query = query_from(token, occurrence, index, required=False)
        from .pathpatching import parse as parse_paths
        from .pathpatching import run as run_paths

        receivers, sender_heads = parse_paths(receiver, senders, site.value, by_position, output)
        target = decoder_text(target_text, None)
        limit = budget(max_memory)
        from ..engines import cpu_threads_for, load_engine
        from ..measures.ablation import batch_size
        from ..measures.alignment import align
        from ..measures.headsites import check as check_site
        from ..select import parse_layers

        eng = load_engine(engine.value, model, device, dtype.value)
        # The alignment and the token before the passes: a refusal costs no forward pass.
        _need_target(eng, target)
        a, b = eng.tokenize(clean), eng.tokenize(pair)
        align(a.ids, b.ids, a.labels, b.labels)
        check_site(site.value, len(a), len(b))
        shape = eng.part_shape(part.value if part else "decoder") if eng.parts else eng.shape
        layers = parse_layers(layer, shape.num_layers, shape.layers)
        batch = batch_size(eng, max(len(a), len(b)), limit)
        if receivers:
            options: dict[str, Any] = {"answer": answer, "wrong": wrong, "position": query, "batch": batch}
            options.update(metric=metric and metric.value, direction=direction.value)
            run_paths(eng, clean, pair, receivers, sender_heads, through=through.value, options=options,
                      npz=npz, json_out=json_out, no_pager=no_pager, top=top)  # fmt: skip
            return
        from ..measures.attrpatch import patch_by
        from ..measures.seq2seq_patch import texts_of
        from .ablating import delayed_progress

        texts = texts_of(target, part and part.value) if eng.parts or target or part else patch_by
        with delayed_progress("patching", json_out) as progress, cpu_threads_for(eng, max(len(a), len(b)) * batch):
            result = texts(
                "both" if attribution else method.value,
                eng,
                clean,
                pair,
                answer=answer,
                wrong=wrong,
                metric=None if metric is None else metric.value,
                direction=direction.value,
                position=query,
                layers=layers,
                batch=batch,
                progress=progress,
                site=site.value,
                by_position=by_position,
            )
        _report(result, npz, output, json_out, no_pager, top)


def _many(
    vs_model: str | None, pairs: Path | None, clean: str | None, corrupted: str | None, answer: str | None,
    wrong: str | None, metric: PatchMetric | None, direction: Direction, site: Site, by_position: bool, dla: bool,
    layer: str, query: Any, model: str | None, engine: str, device: str, dtype: str, max_memory: str | None,
    ray: bool, ray_address: str | None, outputs: dict[str, Any],
) -> None:  # fmt: skip
    """``patch --pairs FILE`` and ``patch --vs-model DIR``: their checks, then their run."""
    load = {"name": engine, "model": model, "device": device, "dtype": dtype}
    if vs_model is not None:
        _vs(vs_model, pairs, clean, corrupted, answer, wrong, by_position or dla or site.value != "z",
            outputs["npz"], outputs["output"])  # fmt: skip
        from .patchpairs import versus_models

        options = {"metric": metric and metric.value, "direction": direction.value, "answer": answer, "wrong": wrong}
        versus_models(vs_model, pairs, clean, corrupted, query=query, options=options, load=load,
                      max_memory=max_memory, outputs=outputs)  # fmt: skip
        return
    assert pairs is not None
    _pairs(pairs, clean, answer, wrong, by_position, dla, outputs["npz"], outputs["output"])
    from .patchpairs import patch_many

    options = {"metric": metric and metric.value, "direction": direction.value, "site": site.value, "layer": layer}
    patch_many(pairs, query=query, options=options, load=load, ray=ray, ray_address=ray_address,
               max_memory=max_memory, outputs=outputs)  # fmt: skip


def _pairs(
    path: Path, clean: str | None, answer: str | None, wrong: str | None, by_position: bool, dla: bool,
    npz: Path | None, output: Path | None,
) -> None:  # fmt: skip
    """--pairs's checks before the file is read: what it cannot go with, the files it writes."""
    from ..render import IMAGE_FORMATS
    from ..result import check_writable
    from .patchpairs import check_pairs_args

    check_pairs_args(path, clean, answer, wrong, by_position, dla)
    if npz is not None:
        check_writable(npz, (".npz",))
    if output is not None:
        check_writable(output, IMAGE_FORMATS)


def _vs(
    vs_model: str, pairs: Path | None, clean: str | None, corrupted: str | None, answer: str | None,
    wrong: str | None, other: bool, npz: Path | None, output: Path | None,
) -> None:  # fmt: skip
    """--vs-model's checks before any model loads."""
    from ..errors import Reason, UsageError
    from ..io.safeio import check_text
    from ..result import check_writable

    if other or output is not None:
        raise UsageError("--vs-model compares each head's z, rows and ablation: drop --site, --by-position, --dla "
                         "and -o (use --json or --npz)", reason=Reason.VS_MODEL)  # fmt: skip
    if pairs is not None:
        from .patchpairs import check_pairs_args

        check_pairs_args(pairs, clean, answer, wrong, False, False)
    elif clean is None:
        raise UsageError("--vs-model needs a prompt (CLEAN, and CORRUPTED to patch) or --pairs FILE",
                         reason=Reason.PATCH_PAIR)  # fmt: skip
    else:
        check_text(clean, "the clean text")
        if corrupted is not None:
            check_text(corrupted, "the corrupted text")
        elif answer is not None or wrong is not None:
            raise UsageError("--answer and --wrong score a patch: give CORRUPTED too", reason=Reason.PATCH_PAIR)
    if npz is not None:
        check_writable(npz, (".npz",))


def _need_target(eng: Any, target: str | None) -> None:
    """An encoder-decoder's patching reads the decoder's answer: refuse one without its text."""
    from ..errors import Reason, UsageError

    if eng.parts and target is None:
        raise UsageError(
            f"{eng.files.spec} is an encoder-decoder: patch reads the decoder's answer after --target-text TEXT",
            hint="add --target-text (the decoder's text) and --part encoder, decoder or cross",
            reason=Reason.PATCH_METRIC,
        )


def _check_pair(
    corrupted: str | None,
    answer: str | None,
    wrong: str | None,
    metric: PatchMetric | None,
    npz: Path | None,
    output: Path | None,
) -> str:
    """patch's checks before any model work: the corrupted text, the files, the metric's
    answers. Returns the corrupted text."""
    from ..errors import Reason, UsageError
    from ..io.safeio import check_text
    from ..render import IMAGE_FORMATS
    from ..result import check_writable

    if corrupted is None:
        raise UsageError("patch needs a corrupted prompt beside the clean one", reason=Reason.PATCH_PAIR)
    check_text(corrupted, "the corrupted text")
    if npz is not None:
        check_writable(npz, (".npz",))
    if output is not None:
        check_writable(output, (*IMAGE_FORMATS, ".html", ".htm"))
    if wrong is not None and answer is None:
        raise UsageError("--wrong goes with --answer", reason=Reason.PATCH_ANSWER)
    if metric in (PatchMetric.logit_diff,) and (answer is None or wrong is None):
        raise UsageError("--metric logit-diff needs --answer and --wrong", reason=Reason.PATCH_ANSWER)
    if metric in (PatchMetric.prob, PatchMetric.logprob) and answer is None:
        raise UsageError(f"--metric {metric.value} needs --answer", reason=Reason.PATCH_ANSWER)
    return corrupted


def _report(result: Any, npz: Path | None, output: Path | None, json_out: bool, no_pager: bool, top: int) -> None:
    """Write patch's files (npz, the figure), then its JSON or its terminal view."""
    from .attrpatching import save_files, view

    missing = save_files(result, npz, output)
    print_result(result, view, json_out, no_pager, top)
    if npz is not None:
        wrote(npz)
    if output is not None:
        wrote(output, missing)


def _attribute(
    text: str,
    corrupted: str | None,
    answer: str | None,
    wrong: str | None,
    token: str | None,
    occurrence: int | None,
    index: int | None,
    lens_top: int,
    top: int,
    model: str | None,
    engine: str,
    device: str,
    dtype: str,
    json_out: bool,
    no_pager: bool,
) -> None:
    """``patch CLEAN --dla``: the attribution of the clean prompt."""
    from ..errors import Reason, UsageError

    if corrupted is not None:
        raise UsageError("--dla attributes one prompt: drop CORRUPTED", reason=Reason.PATCH_PAIR)
    if answer is None or wrong is None:
        raise UsageError("--dla needs --answer and --wrong", reason=Reason.PATCH_ANSWER)
    query = query_from(token, occurrence, index, required=False)
    from ..engines import load_engine
    from ..measures.attribution import attribute_text

    eng = load_engine(engine, model, device, dtype)
    result = attribute_text(eng, text, answer, wrong, position=query, top=lens_top)
    from ..render.terminal.patching import attribution_view

    print_result(result, attribution_view, json_out, no_pager, top)
