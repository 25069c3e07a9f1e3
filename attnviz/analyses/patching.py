"""Patching over many pairs (``patch_pairs``: patch --pairs --json) and two checkpoints
head by head (``versus``: patch --vs-model --json).

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import Reason, UsageError
from .common import _load

if TYPE_CHECKING:
    import numpy as np

    from ..engines import Engine
    from ..measures.patchpairs import PairsResult
    from ..measures.versus import Versus
    from ..select import LayerSpec, Query

Progress = Callable[[int, int], None]


# --- patching over pairs -----------------------------------------------------------


def patch_pairs(
    pairs: str | os.PathLike[str] | Sequence[Any],
    *,
    metric: str | None = None,
    direction: str = "denoise",
    site: str = "z",
    token: str | None = None,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | None = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    dtype: str = "float32",
    max_memory: int | str | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> PairsResult:
    """Patching over many pairs, as ``attnviz patch --pairs FILE``: every pair patched on its
    own, then each head's mean effect with a 95% bootstrap interval over the pairs.

        >>> r = attnviz.patch_pairs("samples/ioi_pairs.jsonl", model="samples/circuits-2l")
        >>> r.mean, r.low, r.high   # (layers, heads) each
        >>> r.ranked(3)             # [(label, mean, low, high, pairs counted), ...]

    ``pairs``: a JSONL or TSV file (docs/patching.md), or a list of dicts with ``clean``,
    ``corrupted`` and optionally ``answer`` and ``wrong`` (or of such tuples).
    ``result.to_dict()`` is the command's ``--json``.
    """
    from ..measures.ablation import batch_size
    from ..measures.patchpairs import patch_pairs as run
    from ..measures.patchpairs import read_patch_pairs
    from ..select import Query, parse_layers

    if isinstance(pairs, (str, os.PathLike)):
        given = read_patch_pairs(os.fspath(pairs))
    else:
        given = [_pair(item, i) for i, item in enumerate(pairs)]
        if not given:
            raise UsageError("patch_pairs(): no pairs given", reason=Reason.PATCH_PAIR)
    query = Query.maybe(token, occurrence, index)
    eng, budget = _load(None, model, engine, device, dtype, max_memory)
    chosen = parse_layers(layers, eng.num_layers, eng.shape.layers)
    longest = max(len(eng.tokenize(p.clean)) for p in given) + 2
    return run(eng, given, metric=metric, direction=direction, site=site, query=query, layers=chosen,
               batch=batch_size(eng, longest, budget), resamples=resamples, seed=seed)  # fmt: skip


def _pair(item: Any, i: int) -> Any:
    """A ``PatchPair`` from a dict or a tuple given to ``patch_pairs``."""
    from ..measures.patchpairs import COLUMNS, PatchPair

    fields = dict(zip(COLUMNS, item, strict=False)) if isinstance(item, (tuple, list)) else item
    if (
        not isinstance(fields, dict)
        or not isinstance(fields.get("clean"), str)
        or not isinstance(fields.get("corrupted"), str)
    ):
        raise UsageError(
            f"patch_pairs(): pair {i} is not a dict (or tuple) with clean and corrupted texts", reason=Reason.TYPE
        )
    return PatchPair(fields["clean"], fields["corrupted"], fields.get("answer"), fields.get("wrong"), f"pair {i}")


# --- two checkpoints head by head ---------------------------------------------------


def versus(
    pairs: Sequence[Any],
    model_a: Engine,
    model_b: Engine,
    *,
    metric: str | None = None,
    direction: str = "denoise",
    query: Query | None = None,
    batch: int | None = None,
    progress: Progress | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> Versus:
    """Every head's change from ``model_a`` to ``model_b`` (``measures.versus``) on each
    ``PatchPair`` (corrupted "" : no patching), at each pair's scored token: ``patch
    --vs-model``. Ctrl-C keeps the pairs done (``partial``)."""
    from ..measures.base import NORM, WEIGHT
    from ..measures.versus import QUANTITIES, check_same_shape, summarise

    check_same_shape(model_a.shape, model_b.shape, model_a.files.spec, model_b.files.spec)
    patching = all(p.corrupted for p in pairs)
    changes: dict[str, list[np.ndarray]] = {q: [] for q in QUANTITIES}
    notes: list[str] = []
    names = ("", "")
    partial = False
    try:
        for i, pair in enumerate(pairs):
            a = _versus_reads(model_a, pair, metric, direction, query, batch, patching, notes)
            b = _versus_reads(model_b, pair, metric, direction, query, batch, patching, notes)
            if a["ids"] != b["ids"]:
                raise UsageError(
                    f"{pair.where}: the two models tokenize the clean prompt differently", reason=Reason.VS_MODEL
                )
            for q in ("patching", "ablation"):
                if q in a:
                    changes[q].append(b[q] - a[q])
            for q in (WEIGHT.name, NORM.name):
                if q in a and q in b:
                    changes[q].append(_distance(a[q], b[q]))
            names = (a.get("metric", ""), direction if patching else "")
            if progress is not None:
                progress(i + 1, len(pairs))
    except KeyboardInterrupt:
        partial = True
    result = summarise(model_a.files.spec, model_b.files.spec, model_a.name, changes, names[0], names[1], partial,
                       resamples, seed=seed)  # fmt: skip
    return replace(result, notes=tuple(dict.fromkeys(notes)))


def _distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from ..measures.versus import total_variation

    return total_variation(a, b)


def _versus_reads(
    eng: Engine,
    pair: Any,
    metric: str | None,
    direction: str,
    query: Query | None,
    batch: int | None,
    patching: bool,
    notes: list[str],
) -> dict[str, Any]:
    """One model on one pair: its (N, H, S) weight and norm-share rows and (N, H) ablation
    effects at the scored token, and with a corrupted prompt its (N, H) patching effects."""
    from ..errors import MeasureError
    from ..measures.base import NORM, WEIGHT
    from ..measures.patching import patch_heads
    from ..measures.patchpairs import prepare_pairs
    from ..measures.versus import shares
    from ..pipeline import Selection, plan, read
    from ..select import Query as Q

    out: dict[str, Any] = {}
    if patching:
        (prepared,), lm = prepare_pairs(eng, [pair], metric, query)
        result = patch_heads(eng, prepared.clean, prepared.corrupted, prepared.metric, position=prepared.position,
                             direction=direction, batch=batch, lm=lm)  # fmt: skip
        if result.partial:
            raise KeyboardInterrupt
        out["patching"], out["metric"], position = result.effect, result.metric, result.position
        tokens = prepared.clean
    else:
        tokens = eng.tokenize(pair.clean)
        if query is not None:
            position = query.resolve(tokens, "the clean text")[-1]
        else:
            plain = [i for i in range(len(tokens)) if not tokens.special[i]] or list(range(len(tokens)))
            position = plain[-1]
    out["ids"] = list(tokens.ids)
    planned = plan(pair.clean, eng, Selection(queries=(Q(index=position),)))
    out[WEIGHT.name] = read(planned, eng).attention.weights[:, :, 0, :].astype(float)
    try:
        normed = plan(pair.clean, eng, Selection(queries=(Q(index=position),), measure=NORM.name))
        out[NORM.name] = shares(read(normed, eng).attention.weights[:, :, 0, :])
    except MeasureError as exc:
        notes.append(f"no norm change: {exc.message}")
    from .ablation import ablation_of

    out["ablation"] = ablation_of(eng, planned, "zero").effect
    return out
