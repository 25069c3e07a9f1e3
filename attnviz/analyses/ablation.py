"""Head ablation from Python: ``ablate`` (compare --ablate --json) and the effects ``show --ablate`` reads.

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .common import _load, _query

if TYPE_CHECKING:
    import numpy as np

    from ..engines import Engine
    from ..measures.ablation import Effects
    from ..pipeline import Plan
    from ..result import Attention, HeadEffects, Provenance
    from ..select import LayerSpec

Progress = Callable[[int, int], None]


# --- ablation ---------------------------------------------------------------------


def query_effects(
    eng: Engine,
    planned: Plan,
    att: Attention,
    mode: str,
    max_memory: int | None = None,
    progress: Progress | None = None,
) -> HeadEffects:
    """What removing each head of ``att``'s layers does at each of its queries (a split
    word: the mean over its tokens): ``show --ablate``. Ctrl-C stops it (KeyboardInterrupt)."""
    import numpy as np

    from ..engines import cpu_threads_for
    from ..measures.ablation import Runner, ablate_text, batch_size
    from ..result import HeadEffects

    runner = Runner(eng, planned.tokens, planned.part, planned.target)
    batch = batch_size(eng, len(planned.tokens) + (len(planned.target) if planned.target else 0), max_memory)
    with cpu_threads_for(eng, len(planned.tokens) * batch):
        found = ablate_text(runner, mode, batch, att.layers, progress=progress)
    if found.partial:
        raise KeyboardInterrupt
    slots = range(len(att.queries))
    effect = np.stack([found.effect[:, :, list(att.pieces_of_query(slot))].mean(-1) for slot in slots], axis=-1)
    return HeadEffects(mode, effect)


def plan_effects(
    eng: Engine, planned: Plan, layers: Sequence[int], mode: str, max_memory: int | None, progress: Progress | None
) -> Effects:
    """The effects of removing each head of ``layers`` of the planned part, for its first
    query (``planned.queries[0]``), with the LM numbers where the checkpoint has an LM head
    (``compare --ablate``)."""
    from ..engines import cpu_threads_for
    from ..measures.ablation import Runner, ablate_text, batch_size
    from ..measures.lm import load_lm_head

    runner = Runner(eng, planned.tokens, planned.part, planned.target)
    queries = planned.queries[0] if planned.queries else ()
    lm = load_lm_head(eng, planned.part)
    # A masked LM predicts the query's own token with it masked: a pass over that text.
    lm_query = queries[0] if lm is not None and queries else None
    batch = batch_size(eng, len(planned.tokens) + (len(planned.target) if planned.target else 0), max_memory)
    with cpu_threads_for(eng, len(planned.tokens) * batch):
        if lm is not None and lm.kind == "causal":  # the next token: from the same passes
            return ablate_text(runner, mode, batch, layers, lm=lm, lm_query=lm_query, progress=progress)
        effects = ablate_text(runner, mode, batch, layers, progress=progress)
        if lm is not None and lm_query is not None and not effects.partial:
            effects = lm.effects(runner, effects, mode, batch, layers, lm_query, progress)
    return effects


@dataclass(frozen=True)
class HeadAblation:
    """What removing each head does at one token (``attnviz compare --ablate``).

    Shape legend: N the ablated layers (``layers``), H the heads.

    Attributes:
        tokens: the text's tokens; query: the token positions the effect is averaged over.
        layers: the model layers ablated (``effect[n]`` is layer ``layers[n]``).
        effect: (N, H) 1 − cos of the final hidden state at the query.
        kl, delta_logprob: (N, H) with an LM head (KL(p ‖ p_ablated) in nats, the change
            in log p of ``top_token``), else None.
        effects: the whole ``measures.ablation.Effects`` (every position, the passes).
        provenance: the model and engine.
    """

    tokens: tuple[str, ...]
    query: tuple[int, ...]
    layers: tuple[int, ...]
    effect: np.ndarray
    kl: np.ndarray | None
    delta_logprob: np.ndarray | None
    effects: Effects
    provenance: Provenance

    @property
    def heads(self) -> int:
        return int(self.effect.shape[1])

    def records(self) -> list[dict[str, Any]]:
        """One dict per (layer, head): layer, head, effect, kl, delta_logprob (None where
        there is no number), for ``pandas.DataFrame(result.records())``."""
        from ..result import jsonable

        out = []
        for n, layer in enumerate(self.layers):
            for h in range(self.heads):
                row: dict[str, Any] = {"layer": layer, "head": h, "effect": self.effect[n, h]}
                row["kl"] = None if self.kl is None else self.kl[n, h]
                row["delta_logprob"] = None if self.delta_logprob is None else self.delta_logprob[n, h]
                out.append(jsonable(row, None))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The provenance, ``compare --ablate --json``'s "ablation" object, and per head
        its effect, kl and delta_logprob as compare's rows carry them (rounded)."""
        from ..result import jsonable, provenance_fields

        out = {**provenance_fields(self.provenance), "tokens": list(self.tokens), "query_indices": list(self.query)}
        out["ablation"] = self.effects.to_dict()
        out["heads"] = self.records()
        return jsonable(out)


def ablate(
    sentence: str,
    token: str | None = None,
    *,
    occurrence: int | None = None,
    index: int | None = None,
    mode: str = "zero",
    model: str | None = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    dtype: str = "float32",
    max_memory: int | str | None = None,
    pair: str | None = None,
    target: str | None = None,
    part: str | None = None,
) -> HeadAblation:
    """Remove each head of ``layers`` (default all) in turn, its output before W^O set to
    zero (``mode="mean"``: its mean over the text's tokens), and measure what that does at
    ``token``: 1 − cos of the final hidden state, and with an LM head the KL divergence and
    the change in log p of the top token. One forward pass per head batch.

        >>> r = attnviz.ablate("The animal didn't cross the street because it was too tired", "it", layers="0-1")
        >>> r.effect.shape                    # (layers, heads)
        (2, 12)

    The same numbers as ``attnviz compare SENTENCE --token it --ablate --json``.
    """
    from ..measures.ablation import check_mode
    from ..pipeline import Selection, plan

    check_mode(mode)
    query = _query(token, occurrence, index)
    selection = Selection(queries=(query,), layers=layers, part=part)
    eng, budget = _load(sentence, model, engine, device, dtype, max_memory)
    planned = plan(sentence, eng, selection, pair=pair, target=target)
    return ablation_of(eng, planned, mode, budget)


def ablation_of(
    eng: Engine, planned: Plan, mode: str, max_memory: int | None = None, progress: Progress | None = None
) -> HeadAblation:
    """``ablate``'s answer for a planned text (its first query), through ``plan_effects``."""
    from ..engines import engine_provenance

    effects = plan_effects(eng, planned, planned.layers, mode, max_memory, progress)
    query = planned.queries[0]
    layers = tuple(planned.layers)
    effect = effects.effect[list(layers)][:, :, list(query)].mean(-1)
    pick = list(layers)
    return HeadAblation(
        tokens=tuple(planned.tokens.labels),
        query=tuple(query),
        layers=layers,
        effect=effect,
        kl=None if effects.kl is None else effects.kl[pick],
        delta_logprob=None if effects.delta_logprob is None else effects.delta_logprob[pick],
        effects=effects,
        provenance=engine_provenance(eng),
    )
