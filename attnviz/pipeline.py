"""The one road from text to attention: every command, the Python API, minimal pairs,
the explorer and the HTML page go down it.

    run(text, engine, Selection) = read(plan(text, engine, Selection), engine)

    plan      tokenize (a sentence pair, an encoder-decoder's decoder text), choose the
              part, resolve layers, heads, queries and targets: every mistake found
              before the forward pass. A caller with checks of its own (an image's or a
              page's size) makes them between plan and read.
    read      the memory estimate, one forward pass (``forward``), the reading options
              (``transforms.apply``: words, special tokens set aside, head aggregates,
              rollout), and each query's and target's position in the result: a
              ``Reading``.

Nothing after ``read`` touches a model. torch is imported inside ``forward``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .errors import EngineError, MeasureError, Reason, UsageError
from .io.checkpoint import first_nonfinite_layer
from .measures.base import measure_named
from .result import Attention, Reading
from .select import PARTS, LayerSpec, Query, check_measure, find_targets, parse_layers, parse_target
from .tokens import Tokens
from .transforms import View, apply, positions_in

if TYPE_CHECKING:
    from .engines import Engine

__all__ = ["Plan", "Reading", "Selection", "choose_part", "forward", "plan", "read", "run"]


@dataclass(frozen=True)
class Selection:
    """What one run looks at, checked for form on construction (no model needed).

    Attributes:
        queries: the query tokens, each a word (its pieces: one query, the mean of their
            rows) or a raw position; () = every token's rows.
        layers: the layers (``select.parse_layers``; None = all).
        targets: target words (``WORD`` or ``WORD:N``), found on the key side.
        part: an encoder-decoder's attention (None: see ``choose_part``).
        view: the reading options (words, special tokens, head aggregates, rollout).
        heads: the heads picked for showing (None: all), checked against the part's heads.
        all_rows: keep every token's rows even when queries are given; the queries are
            then only located (the explorer and the HTML page start on one).
        measure: "weight", the attention weights α, or the norms ‖α·f(x)‖ (Kobayashi et
            al. 2020, see ``attnviz.measures.norms``): one value norm per head and key, beside the rows.
        writes: what the result is written as afterwards ("json", "json-plain" for values
            outside [0, 1], "npz"), counted in the memory estimate (``engines.memory``).

    Raises (on construction):
        UsageError: a target ``WORD:0``, or an unknown part.
        MeasureError: an unknown measure, or rollout with the norm measure.
    """

    queries: tuple[Query, ...] = ()
    layers: LayerSpec = None
    targets: tuple[str, ...] = ()
    part: str | None = None
    view: View = field(default_factory=View)
    heads: tuple[int, ...] | None = None
    all_rows: bool = False
    measure: str = "weight"
    writes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_measure(self.measure)
        if not measure_named(self.measure).sums_to_one and self.view.rollout:
            raise MeasureError(
                "rollout multiplies attention weights through the layers; it is not defined for the norm measure",
                hint="show the rollout with the weights, or the norms without rollout",
                reason=Reason.NORM_ROLLOUT,
                measure=self.measure,
            )
        object.__setattr__(self, "queries", tuple(self.queries))
        object.__setattr__(self, "targets", tuple(self.targets))
        # Targets are checked for form here (word:N with N >= 1), before any model work.
        for spec in self.targets:
            parse_target(spec)
        if self.part is not None and self.part not in PARTS:
            raise UsageError(f"unknown part {self.part!r} (known: {', '.join(PARTS)})", reason=Reason.UNKNOWN_PART)


@dataclass(frozen=True)
class Plan:
    """One run resolved before its forward pass.

    Attributes:
        tokens: the sentence (an encoder-decoder's source).
        target: the decoder's tokens (``engine.tokenize_target``) for the "decoder" and
            "cross" parts; None otherwise.
        part: see ``choose_part``; None for a model with one stack.
        layers: the part's layers (0-based), in the order asked.
        queries: each query's token positions on the part's query side (a split word: all
            its pieces), in the order asked; () = every token.
        targets: each target word's token positions on the part's key side.
        selection: what was asked (its view, heads and ``all_rows``).
    """

    tokens: Tokens
    target: Tokens | None
    part: str | None
    layers: tuple[int, ...]
    queries: tuple[tuple[int, ...], ...]
    targets: dict[str, tuple[int, ...]]
    selection: Selection

    @property
    def query_tokens(self) -> Tokens:
        """The tokens queries are found in: the target for "decoder" and "cross"."""
        return self.tokens if self.target is None else self.target

    @property
    def where(self) -> str:
        """The query side, in words, for messages."""
        from .io.safeio import text_noun

        return text_noun(self.tokens.text) if self.target is None else "the decoder text"


def choose_part(engine: Engine, part: str | None, has_target: bool) -> str | None:
    """Which attention to show: None for a model with one stack; for an encoder-decoder,
    ``part`` or, when not given, "cross" with a decoder text and "encoder" without.

    Raises:
        UsageError: an unknown part, a part on a one-stack model, a decoder text for a
            one-stack model, or a decoder part without a decoder text.
    """
    if part is not None and part not in PARTS:
        raise UsageError(f"unknown part {part!r} (known: {', '.join(PARTS)})", reason=Reason.UNKNOWN_PART)
    if not engine.parts:
        if part is not None:
            engine.part_shape(part)  # raises, naming the model
        if has_target:
            engine.tokenize_target("?")  # raises, naming the model
        return None
    if part is None:
        return "cross" if has_target else "encoder"
    if part != "encoder" and not has_target:
        raise UsageError(
            f"{part} attention is the decoder's: it needs the decoder text (the target)", reason=Reason.NO_TARGET
        )
    return part


def check_heads(heads: Sequence[int] | None, num_heads: int) -> None:
    """Picked head numbers against the model's heads.

    Raises:
        UsageError: a head out of range. facts: reason "head", ``num_heads``.
    """
    bad = [h for h in heads or () if not 0 <= h < num_heads]
    if bad:
        raise UsageError(
            f"head {bad[0]} is out of range: this model has {num_heads} heads (0..{num_heads - 1})",
            reason=Reason.HEAD,
            num_heads=num_heads,
        )


def plan(
    text: str | Tokens,
    engine: Engine,
    selection: Selection,
    *,
    pair: str | None = None,
    target: str | Tokens | None = None,
    where: str | None = None,
) -> Plan:
    """Tokenize and resolve the selection: every mistake found before the forward pass,
    in this order: the text, the part, the decoder text, layers, heads, queries, targets.

    ``pair``: a second sentence, encoded with ``text`` as a typed pair. Encoder-decoders:
    ``text`` is the source and ``target`` the decoder's text; queries are looked up on
    the part's query side (the target for "decoder" and "cross") and target words on its
    key side (the source for "encoder" and "cross"). ``where`` names the text in messages.

    Raises:
        UsageError: two queries share a token (facts: reason "overlap"): each token is one
            query's, or its row would be counted twice (found by fuzzing); the errors of
            ``engine.tokenize``, ``choose_part``, ``select.parse_layers``, ``check_heads``,
            ``select.Query.resolve`` and ``select.find_targets``.
    """
    if isinstance(text, Tokens):
        tokens = text
    else:
        tokens = engine.tokenize(text) if pair is None else engine.tokenize_pair(text, pair)
    part = choose_part(engine, selection.part, target is not None)
    target_tokens = None
    if part in ("decoder", "cross") and target is not None:
        target_tokens = engine.tokenize_target(target) if isinstance(target, str) else target
    query_tokens = tokens if target_tokens is None else target_tokens
    key_tokens = tokens if part == "cross" else query_tokens
    if target_tokens is not None:
        where = "the decoder text"
    shape = engine.part_shape(part)
    layers = parse_layers(selection.layers, shape.num_layers, shape.attention_layers)
    if selection.view.needs_full and shape.hybrid:
        raise UsageError(
            "rollout multiplies the attention of every layer in turn, and this hybrid model's layers "
            f"{', '.join(str(n) for n in range(shape.num_layers) if n not in shape.layers)} have none to multiply",
            reason=Reason.ROLLOUT_HYBRID,
        )
    check_heads(selection.heads, shape.num_heads)
    groups = tuple(q.resolve(query_tokens, where) for q in selection.queries)
    if selection.view.words:  # a query on a piece of a word is that whole word under words
        groups = tuple(whole_words(query_tokens, g) for g in groups)
    taken: set[int] = set()
    for group in groups:
        shared = taken & set(group)
        if shared:
            raise UsageError(
                f"two query words share token {min(shared)}: each token can belong to one query", reason=Reason.OVERLAP
            )
        taken |= set(group)
    targets = find_targets(key_tokens, selection.targets, "the source" if part == "cross" else where)
    return Plan(tokens, target_tokens, part, layers, groups, targets, selection)


def whole_words(tokens: Tokens, positions: Sequence[int]) -> tuple[int, ...]:
    """``positions`` widened to every token of the words that hold them: with words
    merged, a query covering part of a word ("council" of "councilmen", a raw position on
    one piece, "##men") reads as that word, whose row is the mean of all its pieces."""
    from .transforms import word_groups

    picked = {int(p) for p in positions}
    return tuple(i for group in word_groups(tokens) if picked & set(group) for i in group)


def read(planned: Plan, engine: Engine, max_memory: int | None = None) -> Reading:
    """One forward pass of ``planned``, read the way its view asks (``transforms.apply``),
    with each query's and target's position in the result.

    Only the queries' rows are computed (all of them with ``all_rows`` or no queries);
    rollout needs every row of layers 0..max(layers), so those are computed then.
    ``max_memory``: see ``forward``.
    """
    selection, layers = planned.selection, planned.layers
    view = selection.view
    every_row = selection.all_rows or not planned.queries
    if view.needs_full:
        rows: tuple[int, ...] = ()
        computed = tuple(range(max(layers) + 1))
    else:
        rows = () if every_row else tuple(sorted({p for g in planned.queries for p in g}))
        computed = layers
    att = forward(
        planned.tokens,
        engine,
        computed,
        rows,
        max_memory,
        target=planned.target,
        part=planned.part,
        measure=selection.measure,
        writes=selection.writes,
    )
    groups = () if selection.all_rows else planned.queries
    if groups or view != View() or computed != layers:
        att = apply(att, view, groups, layers)
    found = tuple(positions_in(att, g) for g in planned.queries)
    queries = tuple(g[0] for g in found) if found else att.queries
    targets = {word: positions_in(att, idx) for word, idx in planned.targets.items()}
    return Reading(att, queries, targets, found)


def run(
    text: str | Tokens,
    engine: Engine,
    selection: Selection,
    *,
    pair: str | None = None,
    target: str | Tokens | None = None,
    where: str | None = None,
    max_memory: int | None = None,
) -> Reading:
    """Text to ``Reading`` down the layers once: ``read(plan(...))``; see both."""
    return read(plan(text, engine, selection, pair=pair, target=target, where=where), engine, max_memory)


def forward(
    tokens: Tokens,
    engine: Engine,
    layers: Sequence[int],
    rows: Sequence[int] = (),
    max_memory: int | None = None,
    *,
    target: Tokens | None = None,
    part: str | None = None,
    measure: str = "weight",
    writes: Sequence[str] = (),
) -> Attention:
    """One forward pass of ``tokens`` -> an ``Attention`` of ``layers`` and the query
    ``rows`` (token positions, in the order given; () = every token's rows), raw: no
    reading option applied. ``read`` calls it; tests use it for the engines' raw rows.

    The norm ``measure``: ‖α_hij·f_h(x_j)‖ = α_hij·‖f_h(x_j)‖ (Kobayashi et al. 2020), the
    value norms (H, S) of each layer, computed beside the rows, times the rows.

    Before the pass, its memory (and that of writing the result as ``writes``, see
    ``Selection``) is estimated and checked against ``max_memory`` bytes, or against the
    memory free on the engine's device when None.

    Encoder-decoders: ``part`` (from ``choose_part``) and, for "decoder" and "cross",
    ``target`` (from ``engine.tokenize_target``), whose tokens the query rows index;
    cross-attention's keys are ``tokens``, the source. Those two parts run the whole
    model with full eager weights (no memory estimate; short texts).

    Raises:
        MemoryBudgetError: the pass would not fit; nothing has been allocated for it.
        EngineError: the weights hold NaN or infinite values.
    """
    import numpy as np
    import torch

    from .engines import cpu_threads_for, engine_provenance, memory

    m = measure_named(check_measure(measure))
    norms = m.needs_values
    shape = engine.part_shape(part)
    query_tokens, key_tokens = tokens, None
    if part in ("decoder", "cross"):
        if target is None:
            raise UsageError(f"{part} attention needs the decoder text", reason=Reason.NO_TARGET)
        query_tokens = target
        key_tokens = tokens if part == "cross" else None
    chosen = tuple(layers)
    asked = tuple(rows)
    if target is None or part in (None, "encoder"):
        need = memory.estimate(
            engine.shape, engine.sizes, len(tokens), chosen, len(asked) if asked else None, tuple(writes)
        )
        free, where = memory.available(engine.device) if max_memory is None else (None, "")
        memory.check(need, max_memory, free, where)
        with cpu_threads_for(engine, len(tokens)):
            # None: every row, the full matrices
            out = engine.forward(tokens, chosen, asked or None, measure=m)
        picked = torch.stack([a[0] for a in out.attentions])  # (N, H, Q, S)
        values = None if out.value_norms is None else torch.stack([n[0] for n in out.value_norms])  # (N, H, S)
    else:
        with cpu_threads_for(engine, len(tokens) + len(target)):
            both = engine.forward_seq2seq(tokens, target, measure=m)
        full = both.part(part)
        stacked = torch.stack([full.attentions[i][0] for i in chosen])  # (N, H, L, S)
        picked = stacked[:, :, list(asked or range(len(query_tokens))), :]  # (N, H, Q, S)
        values = None if full.value_norms is None else torch.stack([full.value_norms[i][0] for i in chosen])
    if norms:
        if values is None:
            raise EngineError(f"the {engine.name} engine returned no value norms", hint="report this as a bug")
        picked = m.combine(picked.float(), values.float())  # (N, H, Q, S): α_hij·‖f_h(x_j)‖
    weights = picked.to(device="cpu", dtype=torch.float32).numpy().astype(np.float32, copy=False)
    bad = first_nonfinite_layer(weights, chosen)
    if bad is not None:
        raise EngineError(
            f"the attention {'norms' if norms else 'weights'} of layer {bad} hold NaN or infinite values",
            hint="the weights overflow in this dtype or are damaged; try float32 or another checkpoint",
        )
    provenance = replace(engine_provenance(engine), shape=shape)  # the part's shape (encoder, decoder, cross)
    return Attention(
        tokens=query_tokens,
        weights=weights,
        layers=chosen,
        queries=asked or tuple(range(len(query_tokens))),
        provenance=provenance,
        part=part,
        key_tokens=key_tokens,
        measure=measure,
    )
