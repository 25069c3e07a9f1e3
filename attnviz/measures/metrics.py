"""Per-head statistics of attention rows, and the head tables ``attnviz compare`` prints.

Pure numpy: every function takes arrays plus explicit positions or masks and returns
arrays or frozen dataclasses (``HeadStats``, ``PairStats``) that own their JSON.
Nothing here touches a model, torch, rich or typer.

Shape legend: S tokens; ``...`` any leading axes (N layers, H heads). A *row* is one
query's attention distribution over the S tokens (non-negative, sums to 1).

Conventions (also in the README):

- Masks are boolean, True = may attend (the package's one mask convention).
- A query *word* split into several tokens ("council", "##men") gets one row: the mean
  of its pieces' rows, as Clark et al. (2019, "What Does BERT Look At?") do for
  word-level attention. Its "self" share is the weight on any of its pieces, "prev" is
  the token just before its first piece, "next" the token just after its last piece,
  and distances are counted from its nearest piece.
- A target word's weight is the sum over its pieces (attention *to* a word adds up).
  A target that occurs several times is summed over every occurrence; ``word:N`` picks
  the N-th occurrence only.
- Special tokens are the ones the tokenizer added ([CLS], [SEP], <s>, BOS): their total
  weight is the "sink" share.
- Models with learned sink logits (GPT-OSS) put part of each row on no token at all:
  that share, 1 - the row's sum, is ``sink_logit`` (None for every other model).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import Reason, UsageError
from ..result import Attention, jsonable
from ..tokens import Tokens, is_punctuation

# Sort keys of ``sort_rows``; True = largest first.
SORT_KEYS: dict[str, bool] = {
    "weight": True,
    "entropy": False,
    "sink": True,
    "distance": True,
    "delta": True,
    "effect": True,
}


# --- per-row statistics ----------------------------------------------------------


def entropy(rows: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Normalised entropy of each row: 0 = all weight on one token, 1 = uniform.

    ``H(p) / log(n)`` with n the number of tokens the row may attend to: ``mask.sum(-1)``
    with a mask, S without. For a decoder pass the causal mask: the query at position i
    sees i + 1 tokens, and a uniform spread over those is entropy 1 (normalising by
    log(S) would call every early token "focused"). A row that sees one token has
    entropy 0 (one token can only hold everything). Rows are renormalised over the
    visible tokens first, so float32 rounding cannot leave [0, 1]; an all-zero row is 0.

    Args:
        rows: (..., S) attention weights.
        mask: optional boolean (..., S) or (S,), True = visible.

    Returns:
        (...) float64 in [0, 1].
    """
    p = np.asarray(rows, dtype=np.float64)
    if mask is not None:
        visible = np.broadcast_to(np.asarray(mask, dtype=bool), p.shape)
        p = np.where(visible, p, 0.0)
        n = visible.sum(-1)
    else:
        n = np.full(p.shape[:-1], p.shape[-1])
    p = np.clip(p, 0.0, None)
    total = p.sum(-1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    # 0 · log 0 = 0: take the log of 1 where p is zero so no -inf/nan is ever formed.
    h = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
    log_n = np.log(np.maximum(n, 1)).astype(np.float64)
    out = np.divide(h, log_n, out=np.zeros_like(h), where=log_n > 0)
    return np.clip(out, 0.0, 1.0)


def target_weight(rows: np.ndarray, indices: Sequence[int]) -> np.ndarray:
    """(...) total weight of each row on the token positions ``indices`` (e.g. a word's pieces)."""
    rows = np.asarray(rows)
    if len(indices) == 0:
        return np.zeros(rows.shape[:-1])
    return rows[..., list(indices)].sum(-1, dtype=np.float64)


def sink(rows: np.ndarray, special_mask: np.ndarray | Sequence[bool]) -> np.ndarray:
    """(...) share of each row on special tokens ([CLS], [SEP], BOS): the attention sink."""
    special = np.asarray(special_mask, dtype=bool)
    return target_weight(rows, np.flatnonzero(special).tolist())


def sink_logit_share(rows: np.ndarray) -> np.ndarray:
    """(...) share of each row on a learned sink logit (GPT-OSS): 1 - the row's sum.

    Only meaningful for models with learned sinks, whose rows sum to less than 1; for
    any other model it is rounding noise."""
    return np.clip(1.0 - np.asarray(rows, dtype=np.float64).sum(-1), 0.0, 1.0)


def self_share(rows: np.ndarray, query: int | Sequence[int]) -> np.ndarray:
    """(...) share of each row on the query itself (all pieces of a split word)."""
    return target_weight(rows, _span(query))


def prev_share(rows: np.ndarray, query: int | Sequence[int]) -> np.ndarray:
    """(...) share on the token just before the query (its first piece); 0 at position 0."""
    first = min(_span(query))
    return target_weight(rows, [first - 1] if first > 0 else [])


def next_share(rows: np.ndarray, query: int | Sequence[int]) -> np.ndarray:
    """(...) share on the token just after the query (its last piece); 0 at the end."""
    last = max(_span(query))
    size = np.asarray(rows).shape[-1]
    return target_weight(rows, [last + 1] if last + 1 < size else [])


def mean_distance(rows: np.ndarray, query: int | Sequence[int], keep: np.ndarray | None = None) -> np.ndarray:
    """(...) expected distance in tokens from the query to what it attends to.

    ``sum_j p_j · d_j``, with d_j = |j - q| from the nearest piece q of the query (0 on
    the query itself). With ``keep`` ((S,) bool), only those tokens count and each row
    is renormalised over them (compare leaves special tokens out, so a head parked on
    [CLS] is not "long-range"); a row with no weight on them has distance 0.
    """
    rows = np.asarray(rows, dtype=np.float64)
    positions = np.arange(rows.shape[-1])
    span = np.asarray(_span(query))
    d = np.abs(positions[:, None] - span[None, :]).min(axis=1)  # (S,)
    if keep is None:
        return (rows * d).sum(-1)
    kept = np.where(np.asarray(keep, dtype=bool), rows, 0.0)
    total = kept.sum(-1)
    return np.divide((kept * d).sum(-1), total, out=np.zeros_like(total), where=total > 0)


def top_k(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest weights of each row, largest first (ties: earlier token first).

    Returns:
        (indices, weights), each (..., min(k, S)).
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    rows = np.asarray(rows)
    order = np.argsort(-rows, axis=-1, kind="stable")[..., :k]
    return order, np.take_along_axis(rows, order, axis=-1)


def causal_mask(size: int, query: int | Sequence[int]) -> np.ndarray:
    """(S,) True for the tokens a decoder query may see: up to its last piece."""
    return np.arange(size) <= max(_span(query))


def _span(query: int | Sequence[int]) -> list[int]:
    span = [int(query)] if isinstance(query, (int, np.integer)) else [int(q) for q in query]
    if not span:
        raise ValueError("the query has no token positions")
    return span


# --- per-head rows ---------------------------------------------------------------------


# Kinds of target a top list may set aside: trivially explained links (findings.py's
# docstring says why).
EXCLUDE_KINDS = ("special", "adjacent", "punct")
DEFAULT_EXCLUDE = EXCLUDE_KINDS


def parse_exclude(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """'special,adjacent,punct' -> ('special', 'adjacent', 'punct'); 'none' or '' -> ().

    Raises:
        ValueError: an unknown kind (the message lists the known ones).
    """
    if spec is None:
        return ()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    kinds = [s.strip().lower() for s in items if s.strip()]
    if kinds == ["none"]:
        return ()
    unknown = [k for k in kinds if k not in EXCLUDE_KINDS]
    if unknown:
        raise ValueError(f"cannot exclude {unknown[0]!r}: the kinds are {', '.join(EXCLUDE_KINDS)} (or none)")
    return tuple(dict.fromkeys(kinds))


def excluded(tokens: Tokens, span: Sequence[int], kinds: Collection[str]) -> np.ndarray:
    """(S,) True for the tokens ``kinds`` set aside for a query covering ``span``.

    ``special``: the tokens the tokenizer added; ``punct``: ``tokens.is_punctuation`` labels;
    ``adjacent``: the query's own tokens and the tokens just before and after it.
    """
    size = len(tokens)
    out = np.zeros(size, dtype=bool)
    if "special" in kinds:
        out |= np.asarray(tokens.special, dtype=bool)
    if "punct" in kinds:
        out |= np.array([is_punctuation(label) for label in tokens.labels], dtype=bool)
    if "adjacent" in kinds and span:
        lo, hi = max(min(span) - 1, 0), min(max(span) + 1, size - 1)
        out[lo : hi + 1] = True
    return out


@dataclass(frozen=True)
class HeadStats:
    """Where one query word attends in one head (the row ``attnviz compare`` prints).

    Attributes:
        layer, head: 0-based.
        top: the ``k`` strongest targets as (label, weight), largest first.
        top_index: their token positions.
        targets: each target word's weight (summed over its pieces and occurrences).
        entropy: normalised, 0 = all on one token, 1 = uniform over what it may see.
        sink: share on special tokens; self_share, prev, next: on the query, the token
            before it, the token after it; distance: mean distance in tokens to the
            tokens that are not special (the row renormalised over them). These four
            compare query and key positions: None for cross-attention, whose keys are
            another text.
        name: "h5" for a model head; "mean", "max" or "rollout" for an aggregate slot
            (whose ``head`` is then its slot number on the head axis, not a head).
        sink_logit: share on a learned sink logit (GPT-OSS), 1 - the row's sum; None
            (and absent from the JSON) for models without learned sinks.
        effect, kl, delta_logprob: what removing the head does (``ablation.Effects``):
            1 − cos of the query's final hidden state, and with a language-model head
            the KL of its distribution and the change in its top token's log-probability;
            None (and absent from the JSON) without ``--ablate``.
    """

    layer: int
    head: int
    top: tuple[tuple[str, float], ...]
    top_index: tuple[int, ...]
    targets: dict[str, float]
    entropy: float
    sink: float
    self_share: float | None
    prev: float | None
    next: float | None
    distance: float | None
    name: str = ""
    aggregate: bool = False
    sink_logit: float | None = None
    effect: float | None = None
    kl: float | None = None
    delta_logprob: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (rounded as every attnviz JSON is: ``result.jsonable``). An
        aggregate row has ``head`` null and its name in ``aggregate``."""
        sink_logit = {} if self.sink_logit is None else {"sink_logit": self.sink_logit}
        return jsonable(
            {
                "layer": self.layer,
                "head": None if self.aggregate else self.head,
                **({"aggregate": self.name} if self.aggregate else {}),
                "top": [list(t) for t in self.top],
                "top_index": list(self.top_index),
                "targets": dict(self.targets),
                "entropy": self.entropy,
                "sink": self.sink,
                "self": self.self_share,
                "prev": self.prev,
                "next": self.next,
                "distance": self.distance,
                **sink_logit,
                **{
                    name: value
                    for name, value in (("effect", self.effect), ("kl", self.kl), ("delta_logprob", self.delta_logprob))
                    if value is not None
                },
            }
        )


@dataclass(frozen=True)
class PairStats:
    """One head in both sentences of a minimal pair: ``a`` and ``b`` are the same head's
    ``HeadStats``; ``delta`` is B − A for each target."""

    a: HeadStats
    b: HeadStats

    @property
    def layer(self) -> int:
        return self.a.layer

    @property
    def head(self) -> int:
        return self.a.head

    @property
    def delta(self) -> dict[str, float]:
        return {word: self.b.targets[word] - weight for word, weight in self.a.targets.items()}

    def to_dict(self) -> dict[str, Any]:
        """A's row plus B's target weights, top targets, entropy and sink (``*_vs``) and
        ``delta`` (the JSON schema of ``compare --vs``)."""
        return {
            **self.a.to_dict(),
            **jsonable(
                {
                    "targets_vs": dict(self.b.targets),
                    "delta": self.delta,
                    "top_vs": [list(t) for t in self.b.top],
                    "entropy_vs": self.b.entropy,
                    "sink_vs": self.b.sink,
                }
            ),
        }


Row = HeadStats | PairStats


def query_rows(att: Attention, query: int | Sequence[int]) -> np.ndarray:
    """(N, H, S) float64: the query word's rows, the mean of its pieces' rows."""
    return np.asarray(np.mean([att.rows(q) for q in _span(query)], axis=0, dtype=np.float64))


def query_span(att: Attention, query: int | Sequence[int]) -> list[int]:
    """Positions in ``att.tokens`` the query stands for: a query slot merged from several
    tokens or words (``transforms.merge_query``) stands for all of them."""
    span = _span(query)
    if len(span) == 1 and span[0] in att.queries:
        return list(att.query_span(att.query_slot(span[0])))
    return span


def head_stats(
    att: Attention,
    query: int | Sequence[int],
    targets: Mapping[str, Sequence[int]] | None = None,
    top: int = 3,
    exclude: Collection[str] = (),
) -> list[HeadStats]:
    """One ``HeadStats`` per (layer, head slot), in (layer, head) order; see ``sort_rows``.

    ``targets``: each target word's positions in ``att.tokens`` (``select.find_targets``,
    mapped to words with ``transforms.positions_in``), so the words are found once,
    before the forward pass. ``exclude`` (``EXCLUDE_KINDS``) leaves special
    tokens, neighbours or punctuation out of the ``top`` list (and so out of the default
    sort). Aggregate slots (head mean/max, rollout) get rows of their own, named. See
    the module docstring for split words and targets.
    """

    span = query_span(att, query)
    rows = att.rows(_span(query)[0]) if len(_span(query)) == 1 else query_rows(att, span)  # (N, H, S)
    rows = np.asarray(rows, dtype=np.float64)
    size = rows.shape[-1]
    keys = att.keys  # the source tokens, for cross-attention
    mask = causal_mask(size, span) if att.provenance.causal else None
    special = np.asarray(keys.special, dtype=bool)
    spread, sunk = entropy(rows, mask), sink(rows, special)  # (N, H) each
    # Self, neighbour and distance shares compare query and key positions: they mean
    # something only when both index the same text (None for cross-attention).
    positional: dict[str, np.ndarray | None] = dict.fromkeys(("self_share", "prev", "next", "distance"))
    if att.is_self_attention:
        positional.update(
            self_share=self_share(rows, span),
            prev=prev_share(rows, span),
            next=next_share(rows, span),
            distance=mean_distance(rows, span, ~special),
        )
    sinks = None
    if att.provenance.attention_sinks:
        # As Attention.sink_share: NaN (None in the row) where rows lost their raw mass.
        sinks = sink_logit_share(rows)  # (N, H)
        sinks[:, ~att.sink_defined()] = np.nan
    weights = {word: target_weight(rows, idx) for word, idx in (targets or {}).items()}
    # Cross-attention has no neighbours of the query among its keys (another text).
    left_out = excluded(keys, span if att.is_self_attention else (), exclude) | np.isin(np.arange(size), att.hidden)
    top_idx, top_w = top_k(np.where(left_out, -1.0, rows), top)
    labels = keys.labels
    out: list[HeadStats] = []
    for n, layer in enumerate(att.layers):
        for h in range(rows.shape[1]):
            keep = top_w[n, h] >= 0  # fewer than k tokens left after excluding
            out.append(
                HeadStats(
                    layer=int(layer),
                    head=h,
                    top=tuple((labels[i], float(w)) for i, w in zip(top_idx[n, h][keep], top_w[n, h][keep])),
                    top_index=tuple(int(i) for i in top_idx[n, h][keep]),
                    targets={word: float(w[n, h]) for word, w in weights.items()},
                    entropy=float(spread[n, h]),
                    sink=float(sunk[n, h]),
                    **{key: None if value is None else float(value[n, h]) for key, value in positional.items()},
                    name=att.head_name(h),
                    aggregate=h >= att.model_heads,
                    sink_logit=None if sinks is None or np.isnan(sinks[n, h]) else float(sinks[n, h]),
                )
            )
    return out


def pair_stats(
    att_a: Attention,
    query_a: int | Sequence[int],
    targets_a: Mapping[str, Sequence[int]],
    att_b: Attention,
    query_b: int | Sequence[int],
    targets_b: Mapping[str, Sequence[int]],
    top: int = 3,
    exclude: Collection[str] = (),
) -> list[PairStats]:
    """The same query word in two sentences (a minimal pair), head by head.

    Targets are found by text in each sentence separately (``targets_a``/``targets_b``,
    same words), so they may sit at other positions in B.

    Raises:
        UsageError: no targets, different target words, or the two results do not
            cover the same layers and heads.
    """
    if not targets_a:
        raise UsageError("comparing two sentences needs at least one target word", reason=Reason.NO_TARGETS)
    if list(targets_a) != list(targets_b):
        raise UsageError(f"the targets differ: {list(targets_a)} vs {list(targets_b)}", reason=Reason.TARGETS_DIFFER)
    if att_a.layers != att_b.layers or att_a.num_heads != att_b.num_heads:
        raise UsageError(
            f"the two results cover different heads: layers {list(att_a.layers)} × {att_a.num_heads} heads "
            f"vs {list(att_b.layers)} × {att_b.num_heads} heads",
            hint="run both sentences through the same model and layers",
        )
    rows_a = head_stats(att_a, query_a, targets_a, top, exclude)
    rows_b = head_stats(att_b, query_b, targets_b, top, exclude)
    return [PairStats(a, b) for a, b in zip(rows_a, rows_b)]


def sort_key(row: Row, by: str) -> float:
    """The number ``sort_rows`` orders ``row`` by (``by`` is one of SORT_KEYS)."""
    stats = row.a if isinstance(row, PairStats) else row
    if by == "delta":
        if not isinstance(row, PairStats):
            raise UsageError("sorting by change needs two sentences", reason=Reason.DELTA_WITHOUT_PAIR)
        return max((abs(d) for d in row.delta.values()), default=0.0)
    if by == "weight":
        if stats.targets:
            return float(next(iter(stats.targets.values())))
        # A short sentence can leave no candidate once specials, punctuation and the
        # neighbours are set aside (compare on "The cat sat" was an IndexError): weight 0.
        return float(stats.top[0][1]) if stats.top else 0.0
    value = getattr(stats, by)
    if by == "effect":  # an aggregate slot or a head not done (interrupted) goes last
        if value is None and not stats.aggregate:
            _no_effect()
        return float("-inf") if value is None or value != value else float(value)
    if value is None:
        raise UsageError(
            f"cannot sort by {by}: it compares query and key positions, and cross-attention's keys are another text",
            reason=Reason.POSITIONAL_SORT,
        )
    return float(value)


def _no_effect() -> None:
    raise UsageError(
        "sorting by effect needs the heads ablated", hint="add --ablate", reason=Reason.EFFECT_WITHOUT_ABLATE
    )


def check_sort(by: str | None, pair: bool) -> str:
    """The sort key to use (default: delta for pairs, else weight), checked before any work.

    Raises:
        UsageError: an unknown key, or delta without a pair. facts: ``reason``.
    """
    if by is None:
        return "delta" if pair else "weight"
    if by not in SORT_KEYS:
        raise UsageError(f"cannot sort by {by!r} (known: {', '.join(SORT_KEYS)})", reason=Reason.SORT_KEY)
    if by == "delta" and not pair:
        raise UsageError("sorting by change needs two sentences", reason=Reason.DELTA_WITHOUT_PAIR)
    return by


def sort_rows(rows: Sequence[Row], by: str | None = None, limit: int | None = None) -> list[Any]:
    """Rows ordered by ``by``, best first, then cut to ``limit``.

    ``weight``: the first target's weight (the top weight without targets), largest
    first; ``entropy``: most focused first; ``sink``, ``distance``: largest first;
    ``delta``: the largest change on any target (pairs only). Default: ``delta`` for
    pair rows, else ``weight``. Ties keep (layer, head) order.

    Raises:
        UsageError: an unknown key, or a limit below 1.
    """
    by = check_sort(by, bool(rows) and isinstance(rows[0], PairStats))
    if limit is not None and limit < 1:
        raise UsageError(f"the limit must be at least 1, got {limit}", reason=Reason.LIMIT)
    sign = -1.0 if SORT_KEYS[by] else 1.0
    ordered = sorted(rows, key=lambda row: sign * sort_key(row, by))  # stable: ties keep order
    return ordered[:limit] if limit is not None else ordered


def ranking_dict(
    att: Attention,
    rows: Sequence[HeadStats],
    exclude: Sequence[str],
    by: str,
    ablation: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The document of ``attnviz compare --json``: the model's provenance, the measure and
    the reading's steps, the exclusions and the sort, every head's row, and with
    ``--ablate`` the "ablation" object (``measures.ablation.Effects.to_dict``)."""
    out = ranking_meta(att, exclude, by)
    out["rows"] = [row.to_dict() for row in rows]
    if ablation is not None:
        out["ablation"] = dict(ablation)
    return out


def ranking_meta(att: Attention, exclude: Sequence[str], by: str) -> dict[str, Any]:
    """What every compare document carries: the model's provenance, the reading, the sort."""
    from ..result import provenance_fields

    out: dict[str, Any] = provenance_fields(att.provenance)
    out["measure"] = att.measure
    if att.steps:
        out["steps"] = list(att.steps)
    out["exclude"] = list(exclude)
    out["sort"] = by
    if att.tokens.written_start is not None:
        # --generate: the model wrote the tokens from ``given`` on (labelled «like this»).
        out["given"] = att.tokens.written_start
        out["written"] = list(att.tokens.labels[att.tokens.written_start :])
    return out
