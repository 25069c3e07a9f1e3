"""``attnviz patch --pairs FILE``: every head's mean patching effect over a file of pairs;
``--vs-model DIR``: two checkpoints head by head, on one prompt (pair) or a file of pairs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import budget, print_result, wrote

if TYPE_CHECKING:
    from ..select import Query


def check_pairs_args(
    path: Path, clean: str | None, answer: str | None, wrong: str | None, by_position: bool, dla: bool
) -> None:
    """What --pairs cannot go with, said before the file is read."""
    from ..errors import Reason, UsageError

    if clean is not None:
        raise UsageError("--pairs reads the prompts from its file: drop CLEAN and CORRUPTED", reason=Reason.PATCH_PAIR)
    if answer is not None or wrong is not None:
        raise UsageError(
            "--pairs reads each pair's answer and wrong token from its file: drop --answer and --wrong",
            reason=Reason.PATCH_PAIR,
        )
    if by_position:
        raise UsageError("--by-position patches one pair's positions; the pairs' positions differ",
                         reason=Reason.PATCH_PAIR)  # fmt: skip
    if dla:
        raise UsageError("--dla attributes one prompt, not a file of pairs", reason=Reason.PATCH_PAIR)


def patch_many(
    path: Path,
    *,
    query: Query | None,
    options: dict[str, Any],
    load: dict[str, Any],
    ray: bool,
    ray_address: str | None,
    max_memory: str | None,
    outputs: dict[str, Any],
) -> None:
    """Read the pairs (every line checked), load the model, patch each pair (here or on
    Ray), then write the files and print the view or the JSON."""
    from ..engines import cpu_threads_for, load_engine
    from ..measures.ablation import batch_size
    from ..measures.patchpairs import patch_pairs, prepare_pairs, read_patch_pairs
    from ..select import parse_layers
    from .ablating import delayed_progress

    pairs = read_patch_pairs(path)
    limit = budget(max_memory)
    eng = load_engine(**load)
    layers = parse_layers(options.pop("layer"), eng.num_layers, eng.shape.layers)
    prepared, _ = prepare_pairs(eng, pairs, options["metric"], query)  # every refusal before a pass
    longest = max(max(len(p.clean), len(p.corrupted)) for p in prepared)
    batch = batch_size(eng, longest, limit)
    results = None
    if ray or ray_address is not None:
        from ..corpus.distributed import ray_patch

        per_pair = [
            {**options, "position": p.position, "layers": layers, "batch": batch} for p in prepared
        ]  # the same scored token as here: resolved once, on the driver
        address = None if ray_address in (None, "local") else ray_address
        worker = {"model": load["model"], "engine_name": load["name"], "device": load["device"], "dtype": load["dtype"]}
        results = ray_patch(pairs, per_pair, address, **worker)
    quiet = outputs["json_out"]
    with delayed_progress("patching pairs", quiet) as progress, cpu_threads_for(eng, longest * batch):
        result = patch_pairs(
            eng, pairs, query=query, layers=layers, batch=batch, progress=progress, results=results, **options
        )
    from ..render.terminal.patching import pairs_view

    _report(result, pairs_view, **outputs)


def _report(
    result: Any,
    view: Callable[..., Any],
    npz: Path | None,
    output: Path | None,
    json_out: bool,
    no_pager: bool,
    top: int,
) -> None:
    """Write the files (npz, the figure), then the JSON or the terminal view
    (``view``: render.terminal.patching's pairs_view or versus_view)."""
    if npz is not None:
        from ..measures.patching import save_npz

        save_npz(result, npz)
    missing: tuple[str, ...] = ()
    if output is not None:
        from ..render.image import save_figure
        from ..render.image.patching import patch_figure

        missing = save_figure(patch_figure(result), output)
    print_result(result, view, json_out, no_pager, top)
    if npz is not None:
        wrote(npz)
    if output is not None:
        wrote(output, missing)


def versus_models(
    vs_model: str,
    pairs_file: Path | None,
    clean: str | None,
    corrupted: str | None,
    *,
    query: Query | None,
    options: dict[str, Any],
    load: dict[str, Any],
    max_memory: str | None,
    outputs: dict[str, Any],
) -> None:
    """``patch --vs-model DIR``: both models loaded with the same engine, each pair read
    by both, the changes printed (or the JSON)."""
    from ..analyses import versus
    from ..engines import load_engine
    from ..io.models import resolve
    from ..measures.ablation import batch_size
    from ..measures.patchpairs import PatchPair, read_patch_pairs
    from .ablating import delayed_progress

    if pairs_file is not None:
        pairs = read_patch_pairs(pairs_file)
    else:
        assert clean is not None
        pairs = [PatchPair(clean, corrupted or "", options.pop("answer"), options.pop("wrong"), "the prompt")]
    options.pop("answer", None), options.pop("wrong", None)
    resolve(vs_model)  # a missing second model: said before the first loads
    limit = budget(max_memory)
    a = load_engine(load["name"], load["model"], load["device"], load["dtype"])
    b = load_engine(load["name"], vs_model, load["device"], load["dtype"])
    longest = max(len(a.tokenize(p.clean)) for p in pairs) + 2
    with delayed_progress("comparing models", outputs["json_out"]) as progress:
        result = versus(pairs, a, b, query=query, batch=batch_size(a, longest, limit), progress=progress, **options)
    from ..render.terminal.patching import versus_view

    _report(result, versus_view, **outputs)
