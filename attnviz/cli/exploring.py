"""The engine side of ``attnviz explore``: the readings the explorer is handed.

The explorer (``attnviz.tui``) takes an ``Attention`` and callables, never an engine; this
module builds them from one loaded engine through the pipeline (``plan``/``read``): every
query row of a short text (``explore_reading``, ``runner``), or for a long text the rows of
a few query tokens at a time (``RowSource``, ``long_reading``), answered from kept q and k
(``attnviz.nn.keptrows``) where they fit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..result import Attention
from ..tokens import Tokens
from ..tui.long import check_rows_size, window_of
from ..tui.views import MAX_BYTES, check_size

if TYPE_CHECKING:
    from ..analyses import HeadAblation
    from ..engines import Engine
    from ..measures.explain import Explanation
    from ..nn.keptrows import KeptRows
    from ..pipeline import Selection
    from ..result import Reading


def generated(
    engine: Engine, sentence: str, selection: Selection, generation: Any, sampling: Any
) -> tuple[str | Tokens, Selection]:
    """With --generate, the text the explorer opens on: the prompt and what the decoder
    wrote (streamed to stderr before the explorer starts), on the first written token
    unless a start token was named. Without, ``sentence`` and ``selection`` unchanged.

    Raises:
        UsageError: an encoder-decoder (the explorer reads one text; show, compare and
            export read what one wrote).
    """
    if sampling is None:
        return sentence, selection
    from ..errors import UsageError

    if engine.parts:
        raise UsageError(
            "the explorer reads one text; an encoder-decoder's written text is the decoder's",
            hint="see what it wrote with attnviz show, compare or export --generate N",
        )
    text, _, chosen, _ = generation.continued(engine, sentence, selection, sampling)
    return text, chosen


def explore_reading(engine: Engine, sentence: str | Tokens, selection: Selection, budget: int = MAX_BYTES) -> Reading:
    """Every query row of the selection's layers (its queries only located), the text and
    the matrices' size checked before the forward pass.

    Raises:
        UsageError: empty text, too many tokens for the model, or matrices over ``budget`` bytes.
    """
    from ..io.safeio import check_text
    from ..pipeline import plan, read

    planned = plan(
        check_text(sentence) if isinstance(sentence, str) else sentence, engine, replace(selection, all_rows=True)
    )
    check_size(len(planned.layers), engine.shape.num_heads, len(planned.tokens), budget)
    return read(planned, engine)


def runner(
    engine: Engine, layers: tuple[int, ...], budget: int = MAX_BYTES, measure: str = "weight"
) -> Callable[[str | Tokens], Attention]:
    """What the explorer runs a sentence with: ``engine`` (loaded once), every query row
    of ``layers`` (of the weights, or of another ``measure``: the norms), the text and the
    matrices' size checked before the forward pass.

    Raises (from the returned function):
        UsageError: empty text, too many tokens for the model, or matrices over ``budget`` bytes.
    """
    from ..pipeline import Selection

    selection = Selection(layers=layers, measure=measure)

    def run(sentence: str | Tokens) -> Attention:
        return explore_reading(engine, sentence, selection, budget).attention

    return run


class RowSource:
    """The raw rows of some query tokens of ``tokens`` (raw positions), every layer of
    ``layers`` and every head, by the row path; call it as ``rows(queries, measure)``.

    The first call is a forward pass that also keeps q and k (``keptrows``) when they fit
    half of ``budget``; later calls are then answered from them (``kept``), else each is
    a forward pass.
    """

    def __init__(self, engine: Engine, tokens: Tokens, layers: tuple[int, ...], budget: int = MAX_BYTES) -> None:
        from ..nn.keptrows import kept_bytes

        check_rows_size(len(layers), engine.shape.num_heads, len(tokens), budget)
        self._engine, self.tokens, self.layers, self.budget = engine, tokens, layers, budget
        size = kept_bytes(engine, range(max(layers) + 1), len(tokens))
        self._try_keep = size is not None and size <= budget // 2
        self.kept_size = size if self._try_keep and size is not None else 0
        self._kept: KeptRows | None = None
        self._lock = threading.Lock()

    @property
    def kept(self) -> bool:
        """Whether rows are answered from kept q and k (no forward pass)."""
        return self._kept is not None

    def _read(self, queries: tuple[int, ...], measure: str) -> Attention:
        from ..pipeline import Selection, plan, read
        from ..select import Query

        selection = Selection(queries=tuple(Query(index=q) for q in queries), layers=self.layers, measure=measure)
        return read(plan(self.tokens, self._engine, selection), self._engine).attention

    def __call__(self, queries: tuple[int, ...], measure: str = "weight") -> Attention:
        from ..measures.base import measure_named
        from ..nn.keptrows import KeptRows, capture

        asked = tuple(sorted(queries))
        kept = self._kept
        if kept is not None and (not measure_named(measure).needs_values or kept.has_norms):
            return kept.rows(asked, measure)
        with self._lock:  # one capture pass at a time
            keep = self._try_keep and self._kept is None and not measure_named(measure).needs_values
            with capture(self._engine, active=keep) as caught:
                att = self._read(asked, measure)
            if keep:
                self._kept = KeptRows.from_capture(att, caught, self._engine.files.model_type)
                self._try_keep = False
                if self._kept is None:
                    self.kept_size = 0
        return att


def row_runner(
    engine: Engine, tokens: Tokens, layers: tuple[int, ...], budget: int = MAX_BYTES
) -> Callable[..., Attention]:
    """The rows of some query tokens of ``tokens`` (``RowSource``)."""
    return RowSource(engine, tokens, layers, budget)


def long_reading(
    engine: Engine, sentence: str | Tokens, selection: Selection, budget: int = MAX_BYTES
) -> tuple[Reading, RowSource]:
    """A long text's first rows (the window of the start token: the selection's query,
    else the first real token) and the ``RowSource`` that computes other windows.

    Raises:
        UsageError: empty text, too many tokens for the model, or one window's rows over
            ``budget`` bytes (reason "explore_size").
    """
    from ..io.safeio import check_text
    from ..pipeline import Reading, plan

    planned = plan(
        check_text(sentence) if isinstance(sentence, str) else sentence, engine, replace(selection, all_rows=True)
    )
    rows = RowSource(engine, planned.tokens, planned.layers, budget)
    if planned.queries:
        start = planned.queries[0][0]
    else:
        start = next((i for i, special in enumerate(planned.tokens.special) if not special), 0)
    att = rows(window_of(start, len(planned.tokens)))
    return Reading(att, (start,), {}, ((start,),) if planned.queries else ()), rows


def ablater(engine: Engine, layers: tuple[int, ...], mode: str = "zero") -> Callable[[Tokens, int], HeadAblation]:
    """What the explorer's ``a`` key runs: each head of ``layers`` removed in turn (``mode``:
    its output before W^O set to zero, or to its mean) and the effect at the token at raw
    position ``query`` of ``tokens`` (``attnviz.ablate``'s numbers: ``analyses.ablation_of``).
    One forward pass per batch of heads; tui.app calls it in a worker thread."""

    def ablate(tokens: Tokens, query: int) -> HeadAblation:
        from ..analyses import ablation_of
        from ..pipeline import Selection, plan
        from ..select import Query

        planned = plan(tokens, engine, Selection(queries=(Query(index=query),), layers=layers))
        return ablation_of(engine, planned, mode)

    return ablate


def explainer(engine: Engine) -> Callable[[Tokens, int, int, int], Explanation]:
    """What the explorer's ``x`` key runs: head ``head`` of layer ``layer`` for the token
    at raw position ``query`` of ``tokens``, step by step (``attnviz.explain``'s answer:
    ``measures.explain.explain``; the own engine's modules, else a UsageError that the
    explorer shows as its message line)."""

    def explain(tokens: Tokens, query: int, layer: int, head: int) -> Explanation:
        from ..measures.explain import check_head
        from ..measures.explain import explain as run_explain

        check_head(engine.shape.num_layers, engine.shape.num_heads, layer, head)
        return replace(run_explain(engine, tokens, query, layer, head), query_indices=(query,))

    return explain
