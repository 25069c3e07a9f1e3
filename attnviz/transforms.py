"""Attention -> Attention: words merged, special tokens set aside, head aggregates, rollout.

Pure numpy on an ``Attention`` (no model, no torch, no renderer). Every function returns a
new ``Attention`` whose ``steps`` say, in words, what was done; the per-head weights stay
per head and each aggregate is a labelled slot of its own (``Attention.aggregates``).

Shape legend: N layers, H heads (slots), Q query slots, S tokens (or words), W words.

The rules, also in the README:

- **Words** (``merge_words``), as Clark et al. (2019, "What Does BERT Look At?"): attention
  *to* a word is the sum over its pieces (keys summed), attention *from* a word is the mean of
  its pieces' rows (queries averaged), so each word row still sums to 1. Words come from the
  tokenizer's character offsets: a token continues the previous word when it starts where that
  one ends and both characters at the joint are letters or digits ("council" + "men",
  not "didn" + "'"), the same rule that labels a piece ``##men``.
- **A query that covers several tokens** (a ``--token`` word split into pieces, or one that
  covers several words) is one query: its row is the mean of the rows it covers
  (``merge_query``), with or without words. One rule for every view, JSON included.
- **Special tokens set aside** (``hide_special``): the tokens the tokenizer added ([CLS],
  [SEP], <s>, BOS/EOS) get weight 0 as keys and each row is renormalised over what remains
  (``renorm=False`` keeps the raw mass, so rows sum to 1 - sink). A row whose whole mass was
  on special tokens stays all zero.
- **Head aggregates** (``head_aggregates``): per layer, the mean or the elementwise max over
  the model's heads, appended as slots named "mean" / "max" (a max row does not sum to 1).
- **Rollout** (``rollout``), Abnar & Zuidema (2020, "Quantifying Attention Flow in
  Transformers"): per layer the head mean A, the residual added as Â = (A + I) / 2, rows
  renormalised, and multiplied through the layers: R₀ = Â₀, Rₗ = Âₗ · Rₗ₋₁. A product of
  lower-triangular matrices is lower triangular, so a causal model's rollout stays causal.
  It needs the full S × S matrices of every layer from 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import Reason, UsageError
from .measures.base import measure_named
from .result import Attention
from .tokens import Tokens, joins_previous

HEAD_AGGREGATES = ("mean", "max")

ROLLOUT_STEP = "rollout: per layer the head mean A, (A + I)/2 with rows renormalised, multiplied through the layers"


# --- words ---------------------------------------------------------------------------


def step_tags(att: Attention) -> list[str]:
    """The short name of each step (the text before its colon), for titles."""
    return [step.split(":", 1)[0] for step in att.steps]


def word_groups(tokens: Tokens) -> tuple[tuple[int, ...], ...]:
    """The tokens of each word, in order (a partition of 0..S-1).

    A token continues the previous word as ``tokens.joins_previous`` says: adjacent
    letters or digits, one word for the tokenizer (its ``word_ids``), not a joint inside
    a script written without spaces. Special tokens are words of their own.
    """
    groups: list[list[int]] = []
    for i in range(len(tokens)):
        if groups and joins_previous(tokens, i):
            groups[-1].append(i)
        else:
            groups.append([i])
    return tuple(tuple(g) for g in groups)


def word_tokens(tokens: Tokens, groups: Sequence[Sequence[int]]) -> Tokens:
    """A ``Tokens`` with one entry per word: its span of the text, its pieces' strings
    joined by spaces, and its first piece's id (a word has no id of its own)."""
    return Tokens(
        text=tokens.text,
        ids=tuple(tokens.ids[g[0]] for g in groups),
        pieces=tuple(" ".join(tokens.pieces[i] for i in g) for g in groups),
        offsets=tuple((tokens.offsets[g[0]][0], tokens.offsets[g[-1]][1]) for g in groups),
        special=tuple(all(tokens.special[i] for i in g) for g in groups),
        # A word with a written piece counts as written (the continuation may end a given word).
        written_start=None
        if tokens.written_start is None
        else next((w for w, g in enumerate(groups) if g[-1] >= tokens.written_start), len(groups)),
    )


# The words of the last few Tokens objects merged, by identity (each held, so its id is not
# reused): the explorer merges one layer's rows at a time, and at 8,192 tokens finding the
# words and building their Tokens is ~40 ms of Python for ~1 ms of arithmetic.
_WORDS: dict[int, tuple[Tokens, tuple[tuple[int, ...], ...], Tokens, np.ndarray]] = {}


def _words_of(tokens: Tokens) -> tuple[tuple[tuple[int, ...], ...], Tokens, np.ndarray]:
    """``word_groups(tokens)``, their ``word_tokens`` and each token's word (S,)."""
    held = _WORDS.get(id(tokens))
    if held is None or held[0] is not tokens:
        groups = word_groups(tokens)
        word_of = np.empty(len(tokens), dtype=np.int64)
        for w, group in enumerate(groups):
            word_of[group[0] : group[-1] + 1] = w  # a word's pieces are contiguous
        held = (tokens, groups, word_tokens(tokens, groups), word_of)
        if len(_WORDS) >= 4:
            _WORDS.pop(next(iter(_WORDS)))
        _WORDS[id(tokens)] = held
    return held[1], held[2], held[3]


def merge_words(att: Attention) -> Attention:
    """Word-level attention: keys summed over each word's pieces, the rows of a word's
    pieces averaged into one query row (Clark et al. 2019).

    Raises:
        ValueError: words are merged already, a query was merged already, or a kept query word is missing
            some of its pieces' rows (the mean needs them all). Aggregate slots are
            merged like heads (a max slot then holds the sum of per-piece maxima).
    """
    if att.key_pieces is not None:
        raise ValueError("words are merged already")
    if att.query_pieces is not None:
        raise ValueError("merge words before merging a query's pieces")
    groups, words_tokens, word_of = _words_of(att.tokens)
    # Keys: each word's columns summed. The groups are contiguous runs in order, so one
    # reduceat over the key axis (an (S, W) one-hot product took 512 MiB and ~1 TFLOP for
    # 8 query rows of a 32-layer × 32-head model at 8,192 tokens).
    starts = [group[0] for group in groups]
    summed = np.add.reduceat(att.weights.astype(np.float64), starts, axis=-1)  # (N, H, Q, W)
    # Queries: every word with a kept query, each averaged over all of its pieces.
    kept = {q: slot for slot, q in enumerate(att.queries)}
    words = sorted({int(word_of[q]) for q in att.queries})
    rows = []
    for w in words:
        missing = [i for i in groups[w] if i not in kept]
        if missing:
            raise ValueError(f"word {w} covers tokens {list(groups[w])} but the rows of {missing} were not kept")
        rows.append(summed[:, :, [kept[i] for i in groups[w]], :].mean(axis=2))  # (N, H, W)
    weights = np.stack(rows, axis=2).astype(np.float32)  # (N, H, Q', W)
    hidden = tuple(sorted({int(word_of[i]) for i in att.hidden}))
    return dataclasses.replace(
        att,
        tokens=words_tokens,
        weights=weights,
        queries=tuple(words),
        source=att.tokens,
        key_pieces=groups,
        query_pieces=None,
        hidden=hidden,
        steps=(*att.steps, "words: keys summed over a word's pieces, queries averaged over them (Clark et al. 2019)"),
    )


def positions_in(att: Attention, positions: Sequence[int]) -> tuple[int, ...]:
    """Token positions (of the tokenization before words were merged) as positions in
    ``att.tokens``: the words that hold them, or the positions themselves."""
    if att.key_pieces is None:
        return tuple(positions)
    word_of = {i: w for w, group in enumerate(att.key_pieces) for i in group}
    return tuple(sorted({word_of[int(p)] for p in positions}))


def merge_query(att: Attention, positions: Sequence[int]) -> Attention:
    """One query slot for a query that covers several tokens (or words): the mean of their
    rows, at the position of the first. Other query slots are kept as they are.
    With one position this returns ``att`` unchanged.

    Raises:
        ValueError: no positions, or one of them is not a kept query.
    """
    positions = sorted({int(p) for p in positions})
    if not positions:
        raise ValueError("the query has no token positions")
    slots = []
    for p in positions:
        if p not in att.queries:
            raise ValueError(f"token {p} was not kept as a query (have {list(att.queries)})")
        slots.append(att.queries.index(p))
    if len(positions) == 1:
        return att
    merged = att.weights[:, :, slots, :].astype(np.float64).mean(axis=2).astype(np.float32)  # (N, H, S)
    pieces = tuple(sorted({i for s in slots for i in att.pieces_of_query(s)}))
    first = slots[0]
    keep = [s for s in range(len(att.queries)) if s not in slots[1:]]
    weights = att.weights[:, :, keep, :].copy()  # (N, H, Q', S)
    weights[:, :, keep.index(first), :] = merged
    query_pieces = tuple(pieces if s == first else att.pieces_of_query(s) for s in keep)
    labels = " ".join(att.tokens.labels[p] for p in positions)
    return dataclasses.replace(
        att,
        weights=weights,
        queries=tuple(att.queries[s] for s in keep),
        query_pieces=query_pieces,
        steps=(*att.steps, f"query {labels!r} averaged: the mean of the rows of its {len(positions)} tokens"),
    )


# --- special tokens ------------------------------------------------------------------


def hide_special(att: Attention, renorm: bool = True) -> Attention:
    """Set the special tokens aside as keys: weight 0, and each row renormalised over
    the remaining tokens (``renorm=False``: raw mass kept, rows sum to 1 - sink).
    Aggregate slots are treated like heads (aggregate after hiding for a mean that
    sums to 1). A row with all of its mass on special tokens stays all zero.
    """
    special = np.flatnonzero(np.asarray(att.tokens.special, dtype=bool))
    weights = att.weights.astype(np.float64)  # (N, H, Q, S)
    weights[..., special] = 0.0
    # Norms are magnitudes, not a distribution: they stay as they are (a view's shares are
    # then over the remaining tokens anyway).
    measure = measure_named(att.measure)
    renorm = renorm and measure.sums_to_one
    if renorm:
        total = weights.sum(-1, keepdims=True)
        weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    if not measure.sums_to_one:
        step = f"specials set aside: {measure.name} 0 as keys, the other norms as they are"
    else:
        step = "specials set aside: " + (
            "weight 0 as keys, rows renormalised over the rest" if renorm else "weight 0 as keys, raw mass kept"
        )
    return dataclasses.replace(
        att,
        weights=weights.astype(np.float32),
        hidden=tuple(sorted({*att.hidden, *(int(i) for i in special)})),
        steps=(*att.steps, step),
    )


# --- aggregates over heads -------------------------------------------------------------


def head_aggregates(att: Attention, kinds: Sequence[str]) -> Attention:
    """Append per-layer aggregates over the model's heads as named slots: "mean" (the
    average row; sums to 1 where the heads' rows do) and "max" (elementwise maximum).

    Raises:
        ValueError: an unknown kind.
    """
    slots = []
    for kind in kinds:
        if kind not in HEAD_AGGREGATES:
            raise ValueError(f"unknown head aggregate {kind!r} (use one of {', '.join(HEAD_AGGREGATES)})")
        heads = att.weights[:, : att.model_heads].astype(np.float64)  # (N, H, Q, S)
        slots.append(heads.mean(axis=1) if kind == "mean" else heads.max(axis=1))  # (N, Q, S)
    if not slots:
        return att
    extra = np.stack(slots, axis=1).astype(np.float32)  # (N, K, Q, S)
    step = f"head {', '.join(kinds)}: over the {att.model_heads} heads of each layer, as extra rows"
    return dataclasses.replace(
        att,
        weights=np.concatenate([att.weights, extra], axis=1),
        aggregates=(*att.aggregates, *kinds),
        steps=(*att.steps, step),
    )


LAYERS_MEAN = "layers mean"


def layers_mean(att: Attention) -> Attention:
    """Append "layers mean": the mean over the kept layers of each layer's head mean (over
    the model's heads), the same row in every layer's slot, so that every view that
    draws a layer shows it beside that layer's heads (rows sum to 1 where the heads' do).

    Raises:
        ValueError: ``att`` holds no model head.
    """
    if att.model_heads == 0:
        raise ValueError("the layers mean averages the model's heads; none are kept")
    heads = att.weights[:, : att.model_heads].astype(np.float64)  # (N, H, Q, S)
    mean = heads.mean(axis=(0, 1))  # (Q, S)
    extra = np.broadcast_to(mean, (len(att.layers), 1, *mean.shape)).astype(np.float32)  # (N, 1, Q, S)
    span = ", ".join(str(x) for x in att.layers) if len(att.layers) <= 4 else f"{att.layers[0]}..{att.layers[-1]}"
    step = (
        f"layers mean: over the {len(att.layers)} layers shown ({span}) of each layer's mean over its "
        f"{att.model_heads} heads, the same row in every layer"
    )
    return dataclasses.replace(
        att,
        weights=np.concatenate([att.weights, extra], axis=1),
        aggregates=(*att.aggregates, LAYERS_MEAN),
        steps=(*att.steps, step),
    )


def rollout_matrices(weights: np.ndarray) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) of full matrices.

    Args:
        weights: (N, H, S, S) every head's full matrix in layers 0..N-1, in order.

    Returns:
        (N, S, S) float64: ``out[l]`` is the rollout through layers 0..l,
        Âₗ · Âₗ₋₁ · … · Â₀ with Â = (mean over heads + I) / 2, rows renormalised.
    """
    a = np.asarray(weights, dtype=np.float64).mean(axis=1)  # (N, S, S)
    size = a.shape[-1]
    a = 0.5 * a + 0.5 * np.eye(size)[None]
    a = a / a.sum(-1, keepdims=True)
    out = np.empty_like(a)
    acc = np.eye(size)
    for layer in range(a.shape[0]):
        acc = a[layer] @ acc  # (S, S)
        out[layer] = acc
    return out


def rollout(att: Attention) -> Attention:
    """The rollout of raw full matrices as an Attention with one slot, "rollout".

    Raises:
        ValueError: ``att`` does not hold every query row of layers 0..k, holds
            aggregates, or was transformed already (rollout reads raw weights).
    """
    size = len(att.tokens)
    if att.queries != tuple(range(size)):
        raise ValueError("rollout needs every token's row (the full matrices)")
    if att.layers != tuple(range(len(att.layers))):
        raise ValueError(f"rollout needs every layer from 0 up; have {list(att.layers)}")
    if att.aggregates or att.steps or not measure_named(att.measure).sums_to_one:
        raise ValueError("rollout reads the raw per-head weights")
    rolled = rollout_matrices(att.weights)[:, None]  # (N, 1, S, S)
    return dataclasses.replace(att, weights=rolled.astype(np.float32), aggregates=("rollout",), steps=(ROLLOUT_STEP,))


def append_slots(att: Attention, other: Attention) -> Attention:
    """``att`` with ``other``'s aggregate slots appended to its head axis (``other``
    holds aggregates only, over the same layers, queries and tokens)."""
    if other.model_heads != 0:
        raise ValueError("only aggregate slots can be appended")
    if other.layers != att.layers or other.queries != att.queries or other.tokens != att.tokens:
        raise ValueError("the slots cover other layers, queries or tokens")
    return dataclasses.replace(
        att,
        weights=np.concatenate([att.weights, other.weights], axis=1),
        aggregates=(*att.aggregates, *other.aggregates),
        steps=(*att.steps, *(s for s in other.steps if s not in att.steps)),
    )


def select(att: Attention, layers: Sequence[int] | None = None, queries: Sequence[int] | None = None) -> Attention:
    """The given layers and query positions of ``att`` (None: all), in the given order."""
    n = [att.layer_slot(x) for x in layers] if layers is not None else list(range(len(att.layers)))
    q = [att.query_slot(x) for x in queries] if queries is not None else list(range(len(att.queries)))
    qp = None if att.query_pieces is None else tuple(att.query_pieces[i] for i in q)
    return dataclasses.replace(
        att,
        weights=att.weights[n][:, :, q],
        layers=tuple(att.layers[i] for i in n),
        queries=tuple(att.queries[i] for i in q),
        query_pieces=qp,
    )


# --- the whole view ----------------------------------------------------------------


def parse_heads(spec: str | Sequence[str | int] | None) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
    """'1,11' -> ((1, 11), ()); 'mean' -> (None, ('mean',)); '1,11,max' -> ((1, 11), ('max',)).

    Head indices (0-based) pick model heads to draw; "mean" and "max" add per-layer
    aggregates over all of the model's heads. None or "all" -> (None, ()).

    Raises:
        ValueError: an item that is neither a head index nor an aggregate's name.
    """
    if spec is None:
        return None, ()
    items = [str(x).strip().lower() for x in (spec.split(",") if isinstance(spec, str) else spec)]
    heads: list[int] = []
    kinds: list[str] = []
    for item in items:
        if not item or item == "all":
            continue
        if item in HEAD_AGGREGATES:
            kinds.append(item)
        elif item.isascii() and item.isdigit():  # "²".isdigit() is true; int() refuses it
            heads.append(int(item))
        else:
            raise ValueError(f"cannot read head {item!r}: give head numbers (0-based) and/or mean, max")
    return (tuple(dict.fromkeys(heads)) or None), tuple(dict.fromkeys(kinds))


@dataclass(frozen=True)
class View:
    """What to do to the raw weights before showing them (the CLI's reading options).

    Attributes:
        words: merge pieces into words (keys summed, queries averaged).
        hide_special: set special tokens aside as keys.
        renorm: with ``hide_special``, renormalise rows over what remains.
        heads: head aggregates to append per layer ("mean", "max").
        rollout: append the attention rollout as a slot (needs full matrices).
        layers_mean: append the mean over the kept layers of the head means ("layers mean").
    """

    words: bool = False
    hide_special: bool = False
    renorm: bool = True
    heads: tuple[str, ...] = ()
    rollout: bool = False
    layers_mean: bool = False

    def __post_init__(self) -> None:
        for kind in self.heads:
            if kind not in HEAD_AGGREGATES:
                raise ValueError(f"unknown head aggregate {kind!r} (use one of {', '.join(HEAD_AGGREGATES)})")
        if len(set(self.heads)) != len(self.heads):
            raise ValueError(f"head aggregates repeated: {list(self.heads)}")

    @property
    def needs_full(self) -> bool:
        """Whether the engine must return every query row of every layer from 0."""
        return self.rollout


def apply(
    att: Attention,
    view: View,
    query_groups: Sequence[Sequence[int]] = (),
    layers: Sequence[int] | None = None,
) -> Attention:
    """Everything ``view`` asks for, in one documented order.

    1. rollout, from the raw full matrices (if asked), kept aside;
    2. special tokens set aside (per head), then words merged;
    3. each query group (the token positions of one ``--token`` word) merged into one
       query slot, the mean of its rows (``merge_query``);
    4. head aggregates over the transformed per-head rows, then the rollout slot, passed
       through steps 2-3 itself, then the layers mean of the per-head rows, appended last.

    ``query_groups`` are token positions in ``att.tokens`` (before words); they and
    ``layers`` pick what is kept (None / no groups: everything ``att`` holds). With
    ``view.rollout``, ``att`` must hold the full matrices of layers 0..k.
    """
    if not att.is_self_attention and (view.words or view.hide_special or view.rollout):
        # Words, specials set aside and rollout read the keys as the queries' own tokens;
        # cross-attention's keys are another text (the source).
        raise UsageError(
            "words, special tokens set aside and rollout are not implemented for cross-attention",
            reason=Reason.CROSS_VIEW,
        )
    queries: list[int] | None = sorted({int(p) for g in query_groups for p in g}) or None
    rolled = select(rollout(att), layers, queries) if view.rollout else None
    att = select(att, layers, queries)

    def reading(a: Attention) -> Attention:
        if view.hide_special:
            a = hide_special(a, view.renorm)
        groups = [tuple(g) for g in query_groups]
        if view.words:
            a = merge_words(a)
            assert a.key_pieces is not None  # set by merge_words
            word_of = {i: w for w, g in enumerate(a.key_pieces) for i in g}
            groups = [tuple(sorted({word_of[p] for p in g})) for g in groups]
        for g in groups:
            a = merge_query(a, g)
        return a

    att = reading(att)
    att = head_aggregates(att, view.heads)
    if rolled is not None:
        att = append_slots(att, reading(rolled))
    if view.layers_mean:
        att = layers_mean(att)
    return att


# --- measures --------------------------------------------------------------------------

SHARES_STEP = "norm shares: each row's norms over the row's sum (Kobayashi et al. 2020)"


def shares(att: Attention) -> Attention:
    """What a view colours for the norm measure: each row's norms ‖α·f(x)‖ over the row's
    sum, so a row's cells are shares of 0..1 that sum to 1 (an all-zero row stays zero).
    Rows that sum to one (the weights) are returned as they are; ``measure`` stays as it is
    (the numbers are shares of norms, not weights), and a step says so.
    """
    if measure_named(att.measure).sums_to_one or SHARES_STEP in att.steps:
        return att
    w = att.weights.astype(np.float64)  # (N, H, Q, S)
    total = w.sum(-1, keepdims=True)
    out = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    return dataclasses.replace(att, weights=out.astype(np.float32), steps=(*att.steps, SHARES_STEP))


def measure_label(att: Attention) -> str:
    """How views name what a cell shows: the measure's label ("weight", "norm ‖α·f(x)‖"),
    or its share label once ``shares`` made its rows shares ("norm share")."""
    measure = measure_named(att.measure)
    return measure.share_label if SHARES_STEP in att.steps else measure.label
