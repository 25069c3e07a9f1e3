"""attnviz export -o view.html: the interactive page, full or in row mode.

The command itself (options, checks, the images) is export.py; this module plans the
page's queries and layers, checks its size before the forward pass, reads what it holds
(weights, norms, rollout, ablation effects) and writes it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..measures.base import measure_named
from ..render import HTML_BUDGET_BYTES
from .app import hint_for
from .common import queries_from, wrote
from .options import ExportView

if TYPE_CHECKING:
    import numpy as np

    from ..engines import Engine
    from ..pipeline import Plan
    from ..render.html import Options
    from ..select import Query
    from ..tokens import Tokens


def page_queries(tokens: list[str] | None, occurrence: int | None, indexes: list[int] | None) -> list[Query]:
    """The queries of repeatable --token WORD[:N] and --index K, checked before any model work."""
    from ..errors import UsageError
    from ..select import Query

    picked = list(indexes or [])
    if len(picked) <= 1:
        return queries_from(tokens, occurrence, picked[0] if picked else None, required=False)
    if tokens:
        raise UsageError("give --token or --index, not both", hint="--token WORD picks by text, --index K by position")
    if occurrence is not None:
        raise UsageError("--occurrence is for one --token", hint="with --index, give the positions themselves")
    return [Query(index=k) for k in picked]


def page_toggles(words: bool, hide_special: bool, no_renorm: bool, heads: str | None, layers_mean: bool) -> Options:
    """The reading options as the page's opening state (``render.html.Options``): the
    toggles it opens with (``--words``, ``--hide-special``, ``--heads mean``) and the
    heads it draws at first (``--heads 1,11``: the others one click away), checked before
    any model work. One the page has no toggle for is a usage error, not dropped."""
    from ..errors import UsageError
    from ..render.html import Options
    from ..transforms import parse_heads

    if no_renorm:
        raise UsageError(
            "the page renormalises each row when it sets special tokens aside; it has no --no-renorm",
            hint="drop --no-renorm, or see the raw rows with attnviz show --hide-special --no-renorm",
        )
    if layers_mean:
        raise UsageError(
            "the page draws each layer; it has no mean over the layers",
            hint="drop --layers-mean, or see it with attnviz show --layers-mean",
        )
    try:
        picked, kinds = parse_heads(heads)
    except ValueError as exc:
        raise UsageError(str(exc), hint="the page takes --heads mean (its head-mean toggle)") from None
    if "max" in kinds:
        raise UsageError(
            "the page has a head-mean toggle, not a head max",
            hint="use --heads mean, or see the max with attnviz show --heads max",
        )
    return Options(words=words, hide_special=hide_special, mean="mean" in kinds, shown=picked)


def write_page(
    eng: Engine,
    tokens: Tokens,
    queries: Sequence[Query],
    layer: str | None,
    view: ExportView,
    path: Path,
    max_memory: int | None = None,
    measure: str = "weight",
    open_layer: int | None = None,
    *,
    rows: bool = False,
    matrix_layers: Sequence[int] = (),
    part: str | None = None,
    target: str | Tokens | None = None,
    ablate: str | None = None,
    rollout: bool = False,
    toggles: Options | None = None,
) -> None:
    """The interactive page: every query row of the chosen layers (default all), its size
    checked from the token count before the forward pass. A ``measure`` beyond the weights: the page
    carries the norms too and opens on them (a weight/norm toggle). It opens on
    ``open_layer``, by default the layer of the pinned token's strongest non-trivial link
    (``findings``). ``ablate`` ("zero" or "mean"): each head of the page's layers removed
    in turn, its effect at every token carried for the page's bars (full page only).
    ``rollout``: the page carries the rollout (``transforms.rollout``, through every layer
    from 0 as ``show --rollout`` computes it, whichever layers the page keeps) and opens
    with its toggle on (full page only: it needs every layer's full matrices). ``toggles``:
    the words, special-tokens and head-mean toggles it opens with (``page_toggles``).

    Row mode (``rows``, ``matrix_layers``, or full matrices over the budget with a query
    given): ``write_row_page``. An encoder-decoder's ``part`` "encoder" (the source) or
    "decoder" (the self-attention of ``target``, the decoder text)."""
    from ..errors import UsageError
    from ..measures.findings import strongest_links
    from ..pipeline import Selection, plan, read
    from ..render.html import Options, PageAblation, ablation_bytes, check_page_size, save_html
    from ..transforms import View

    selection = Selection(queries=tuple(queries), layers=layer, all_rows=True, part=part)
    planned = plan(tokens, eng, selection, target=target)
    shown = planned.query_tokens  # the decoder text for the decoder part
    if open_layer is not None and open_layer not in planned.layers:
        kept = list(planned.layers)
        raise UsageError(
            f"--open-layer {open_layer} is not among the page's layers ({kept[0]}..{kept[-1]})"
            if kept == list(range(kept[0], kept[-1] + 1))
            else f"--open-layer {open_layer} is not among the page's layers {kept}",
            hint="pick one of them, or widen --layer",
        )
    heads = eng.part_shape(planned.part).num_heads * (
        2 if measure_named(measure).needs_values else 1
    )  # norms: twice the matrices
    heads += 1 if rollout else 0  # the rollout: one matrix more per layer
    fallback = False
    extra = 0 if ablate is None else ablation_bytes(len(planned.layers), eng.shape.num_heads, len(shown))
    if not (rows or matrix_layers):
        try:
            check_page_size(len(planned.layers), heads, len(shown), HTML_BUDGET_BYTES - extra)
        except UsageError as exc:
            if ablate is not None:  # the row-mode page carries no ablation bars
                raise
            if not planned.queries:
                raise UsageError(
                    exc.message,
                    hint=f"{hint_for(exc)}, or give --token WORD (or --index K) for a row-mode page: that token's "
                    "rows in every layer and head",
                ) from None
            if rollout:  # rollout needs every layer's full matrices
                raise
            rows = fallback = True
    toggles = toggles or Options()
    if rows or matrix_layers:
        write_row_page(eng, planned, view, path, max_memory, measure, open_layer, matrix_layers, fallback, toggles)
        return
    rolled = None
    if rollout:
        # The CLI's own path (show --rollout): every row of layers 0..max(layers), rolled
        # out, the page's layers picked; its last slot is the rollout.
        with_rollout = plan(tokens, eng, replace(selection, view=View(rollout=True)), target=target)
        got = read(with_rollout, eng, max_memory)
        both = got.attention
        rolled = both.weights[:, both.model_heads]  # (N, S, S)
        heads_only = replace(both, weights=both.weights[:, : both.model_heads], aggregates=(), steps=())
        got = replace(got, attention=heads_only)
    else:
        got = read(planned, eng, max_memory)  # every query row: whole matrices
    norms = None
    if measure_named(measure).needs_values:
        norms = read(plan(tokens, eng, replace(selection, measure=measure), target=target), eng, max_memory).attention
    query = queries[0] if queries else None
    pinned = got.queries[0] if query is not None else None  # a split word: its first piece
    att = got.attention
    if open_layer is None and pinned is not None:
        # The footer's rule (show): the strongest link not to specials, punctuation or neighbours,
        # from the pinned token's rows (its first piece, as the page pins it).
        found = strongest_links(att, att.query_slot(pinned), 1)
        open_layer = found[0].layer if found else None
    effects = None
    if ablate is not None:
        effects = PageAblation(_page_effects(eng, planned, att.layers, max_memory, ablate), ablate)
    mode = "matrix" if view is ExportView.matrix else "head"
    options = replace(toggles, rollout=rollout)
    save_html(
        att,
        path,
        query=pinned,
        view=mode,
        layer=open_layer,
        norms=norms,
        ablation=effects,
        rollout=rolled,
        options=options,
    )
    wrote(path)


def _page_effects(eng: Engine, planned: Plan, layers: Sequence[int], max_memory: int | None, mode: str) -> np.ndarray:
    """(N_kept, H, S): the effect of removing each head of the page's layers at every token
    (the same passes give every position's final hidden state). Ctrl-C writes no page."""
    from ..engines import cpu_threads_for
    from ..measures.ablation import Runner, ablate_text, batch_size
    from .ablating import delayed_progress

    runner = Runner(eng, planned.tokens)
    batch = batch_size(eng, len(planned.tokens), max_memory)
    with delayed_progress("ablating", False) as progress, cpu_threads_for(eng, len(planned.tokens) * batch):
        found = ablate_text(runner, mode, batch, layers, progress=progress)
    if found.partial:
        raise KeyboardInterrupt
    return found.effect[list(layers)]  # (N, H, S), in the page's layer order


def write_row_page(
    eng: Engine,
    planned: Plan,
    view: ExportView,
    path: Path,
    max_memory: int | None,
    measure: str,
    open_layer: int | None,
    matrix_layers: Sequence[int],
    fallback: bool = False,
    toggles: Options | None = None,
) -> None:
    """The row-mode page: the rows of the planned queries (every piece of their words) in
    every planned layer and head, by the row path (no n × n matrix), plus the full
    matrices of ``matrix_layers``. Every size is checked before the forward pass.
    ``fallback``: the full page was too large (said on stderr once the rows fit)."""
    from ..errors import UsageError
    from ..measures.findings import strongest_links
    from ..pipeline import forward
    from ..render.html import Options
    from ..render.html.rows import RowPage, check_row_page, row_positions, save_html

    if measure_named(measure).needs_values and matrix_layers:
        raise UsageError(
            "the row-mode page's matrix layers hold the attention weights only; the norm measure is in its rows",
            hint="drop --matrix-layer (the rows carry the chosen tokens' norms), or drop --measure norm",
        )
    if not planned.queries:
        raise UsageError(
            "a row-mode page holds the rows of chosen query tokens: say which",
            hint="add --token WORD or --index K (both repeatable)",
        )
    layers, tokens, shown = planned.layers, planned.tokens, planned.query_tokens
    heads = eng.part_shape(planned.part).num_heads
    stored_heads = heads * (2 if measure_named(measure).needs_values else 1)  # the norms: as many rows again
    extra = sorted(set(matrix_layers))
    missing = [m for m in extra if m not in layers]
    if missing:
        raise UsageError(
            f"--matrix-layer {missing[0]} is not among the page's layers ({', '.join(map(str, layers))})"
            if len(layers) < 12
            else f"--matrix-layer {missing[0]} is not among the page's layers",
            hint="pick one of them, or widen --layer",
        )
    if open_layer is None and view is ExportView.matrix and extra:
        open_layer = extra[0]
    positions = row_positions(shown, [p for g in planned.queries for p in g])
    keys = len(tokens) if planned.part == "cross" else len(shown)  # cross-attention: over the source
    check_row_page(
        len(layers), stored_heads, len(positions), keys, len(extra), HTML_BUDGET_BYTES - cross_labels(planned)
    )
    if fallback:
        sys.stderr.write(
            f"note: {len(shown)} tokens' full matrices do not fit the page: it holds the rows of the chosen "
            "tokens (row mode; --matrix-layer N adds a layer's matrices)\n"
        )
    target, part = planned.target, planned.part
    att = forward(tokens, eng, layers, positions, max_memory, target=target, part=part)  # asked rows: no n × n
    matrix = forward(tokens, eng, extra, (), max_memory, target=target, part=part) if extra else None
    norms = None
    if measure_named(measure).needs_values:  # the same rows times the value norms (H, S) of each layer: no n × n either
        norms = forward(tokens, eng, layers, positions, max_memory, target=target, part=part, measure=measure)
    pinned = planned.queries[0][0]
    if open_layer is None:
        found = strongest_links(att, att.query_slot(pinned), 1)  # show's footer rule
        open_layer = found[0].layer if found else None
    t = toggles or Options()
    opens = RowPage(
        query=pinned,
        view="matrix" if view is ExportView.matrix else "head",
        layer=open_layer,
        words=t.words,
        hide_special=t.hide_special,
        mean=t.mean,
        shown=t.shown,
    )
    size, stored = save_html(att, path, matrix, opens, HTML_BUDGET_BYTES - cross_labels(planned), norms)
    norm_note = (
        ""
        if norms is None
        else f"; norms beside them, largest error {stored['norm_max_error']:.2g} "
        f"({stored['norm_share_error']:.2g} in the shares shown)"
    )
    sys.stderr.write(
        f"note: row mode, {len(positions)} query row(s) × {len(layers)} layers × {heads} heads × "
        f"{keys} keys as {'uint' + str(stored['bits'])}: {size / 1e6:.1f} MB, largest error "
        f"{stored['max_error']:.2g}{norm_note}\n"
    )
    wrote(path)


def cross_labels(planned: Plan) -> int:
    """Bytes a cross-attention page spends on the decoder text's labels beside the source's
    (the size estimate counts the keys' tokens): budgeted as generously as those."""
    from ..render.html import PER_TOKEN_BYTES

    return PER_TOKEN_BYTES * len(planned.query_tokens) if planned.part == "cross" else 0
