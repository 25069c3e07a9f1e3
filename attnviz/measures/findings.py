"""Findings that surface themselves: the strongest links that are not trivially explained,
and a summary of minimal pairs across a whole file.

Pure numpy on an ``Attention`` or on arrays; nothing here touches a model or a renderer.

A link is *trivial* when it goes to a special token (the [CLS]/[SEP] sinks), to
punctuation, or to the query itself or its immediate neighbours (previous- and next-token
heads). Those are most of the strongest weights in a BERT-style model, and they hide the
heads that link a word to another word further away: in all-MiniLM-L6-v2 on "The animal
didn't cross the street because it was too tired", the strongest raw link of "it" is
layer 0 head 2 → "because" (1.00, a previous-token head), while layer 3 head 1 and layer 5
head 11 → "animal" come first once the trivial ones are set aside.

Shape legend: N layers, H head slots, S tokens, P pairs, K heads (layer, head) in a summary.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..result import Attention, jsonable
from .metrics import DEFAULT_EXCLUDE, PairStats, excluded


@dataclass(frozen=True)
class Link:
    """One query → target weight in one head (or aggregate slot)."""

    layer: int
    head: str  # "h1", or an aggregate's name
    head_index: int  # slot on the head axis
    query: str
    target: str
    target_index: int
    weight: float

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, rounded as every attnviz JSON is (``result.jsonable``)."""
        return jsonable(
            {
                "layer": self.layer,
                "head": self.head,
                "head_index": self.head_index,
                "query": self.query,
                "target": self.target,
                "target_index": self.target_index,
                "weight": self.weight,
            }
        )


def strongest_links(
    att: Attention,
    slot: int,
    n: int = 5,
    exclude: Collection[str] = DEFAULT_EXCLUDE,
    heads_only: bool = True,
    heads: Collection[int] | None = None,
) -> list[Link]:
    """The ``n`` largest weights of query slot ``slot`` over every layer and head,
    leaving out the ``exclude`` kinds of target (see ``excluded``), largest first.
    ``heads_only``: aggregate slots (mean, max, rollout) are not candidates; ``heads``:
    only these model heads are. Ties keep (layer, head, token) order."""
    span = att.query_span(slot)
    rows = att.weights[:, :, slot, :].astype(np.float64)  # (N, H, S)
    if heads_only:
        rows = rows[:, : att.model_heads]
    if heads is not None:
        rows = np.where(np.isin(np.arange(rows.shape[1]), list(heads))[None, :, None], rows, -np.inf)
    keys = att.keys  # the source tokens, for cross-attention (no neighbours of the query there)
    near = span if att.is_self_attention else ()
    mask = excluded(keys, near, exclude) | np.isin(np.arange(len(keys)), att.hidden)
    candidates = np.where(mask[None, None, :], -np.inf, rows)  # (N, H, S)
    flat = candidates.reshape(-1)
    order = np.argsort(-flat, kind="stable")[:n]
    labels = keys.labels
    query = " ".join(att.tokens.labels[p] for p in span)
    out: list[Link] = []
    for k in order:
        if not np.isfinite(flat[k]) or flat[k] <= 0:
            break
        layer, head, target = np.unravel_index(int(k), candidates.shape)
        out.append(
            Link(
                layer=int(att.layers[layer]),
                head=att.head_name(int(head)),
                head_index=int(head),
                query=query,
                target=labels[int(target)],
                target_index=int(target),
                weight=float(flat[k]),
            )
        )
    return out


# --- minimal pairs, across a file -------------------------------------------------------------


@dataclass(frozen=True)
class HeadShift:
    """One head across every pair of a file: how its weight on A's referent changes.

    ``toward`` per pair is (weight on A's referent in A) − (weight on that word in B):
    positive when the head looks at the referent more in the sentence where it is the
    referent. ``mean`` is its mean over the pairs, ``moved`` how many pairs had it > 0,
    [``low``, ``high``] a percentile bootstrap interval of the mean.
    """

    layer: int
    head: str
    mean: float
    moved: int
    pairs: int
    low: float
    high: float
    level: float

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, rounded as every attnviz JSON is (``result.jsonable``)."""
        return jsonable(
            {
                "layer": self.layer,
                "head": self.head,
                "mean_toward_referent": self.mean,
                "pairs_moved": self.moved,
                "pairs": self.pairs,
                "interval": [self.low, self.high],
                "level": self.level,
            }
        )


def bootstrap_mean(values: np.ndarray, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> np.ndarray:
    """Percentile bootstrap interval of the mean over axis 0.

    Args:
        values: (P, K) one value per pair and head.

    Returns:
        (2, K): the lower and upper ``level`` bounds. The same pairs are resampled for
        every head (one (n_boot, P) draw from ``numpy.random.default_rng(seed)``), so
        the result depends only on ``values`` and ``seed``.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] < 1:
        raise ValueError(f"need (pairs, heads) values with at least one pair, got shape {values.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.shape[0], size=(n_boot, values.shape[0]))  # (B, P)
    means = values[idx].mean(axis=1)  # (B, K)
    tail = (1 - level) / 2 * 100
    return np.percentile(means, [tail, 100 - tail], axis=0)


def toward_referent(pairs: Sequence[Sequence[PairStats]]) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """(P, K) ``toward`` values (see ``HeadShift``) from each pair's unsorted rows, and the
    K (layer, head name) they belong to. The referent is each pair's first target.

    Raises:
        ValueError: no pairs, or pairs that cover different heads.
    """
    if not pairs:
        raise ValueError("no pairs to summarise")
    heads = [(row.layer, row.a.name or f"h{row.head}") for row in pairs[0]]
    values = np.empty((len(pairs), len(heads)))
    for p, rows in enumerate(pairs):
        if [(row.layer, row.a.name or f"h{row.head}") for row in rows] != heads:
            raise ValueError(f"pair {p + 1} covers other heads than pair 1")
        for k, row in enumerate(rows):
            referent = next(iter(row.a.targets))
            values[p, k] = row.a.targets[referent] - row.b.targets[referent]
    return values, heads


def pair_shifts(
    toward: np.ndarray,
    heads: Sequence[tuple[int, str]],
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> list[HeadShift]:
    """Per head, the summary of ``toward`` (P pairs × K heads; see ``HeadShift``),
    sorted by mean change, largest first (ties keep ``heads`` order)."""
    toward = np.asarray(toward, dtype=np.float64)
    if toward.shape[1:] != (len(heads),):
        raise ValueError(f"toward has shape {toward.shape} for {len(heads)} heads")
    low, high = bootstrap_mean(toward, n_boot, level, seed)
    mean = toward.mean(axis=0)
    moved = (toward > 0).sum(axis=0)
    out = [
        HeadShift(
            layer=layer,
            head=head,
            mean=float(mean[k]),
            moved=int(moved[k]),
            pairs=int(toward.shape[0]),
            low=float(low[k]),
            high=float(high[k]),
            level=level,
        )
        for k, (layer, head) in enumerate(heads)
    ]
    return sorted(out, key=lambda s: -s.mean)


SUMMARY_RULE = (
    "toward referent: weight on the pair's first target (the referent in A) in A minus in B, "
    "mean over {n} pairs; pairs: how many moved that way; interval: percentile bootstrap of the mean "
    "(2000 resamples of the pairs, seed {seed})"
)


def pairs_dict(
    att: Attention,
    exclude: Sequence[str],
    by: str,
    rows: Sequence[dict[str, Any]],
    shifts: Sequence[HeadShift],
    pairs: int,
    seed: int,
) -> dict[str, Any]:
    """The document of ``attnviz compare --pairs FILE --json``: compare's header
    (``metrics.ranking_meta``), each pair's rows (with its pair number, sentences and
    token), and the summary across the ``pairs`` pairs with the rule that made it."""
    from .metrics import ranking_meta

    out = ranking_meta(att, exclude, by)
    out["rows"] = list(rows)
    out["summary"] = [s.to_dict() for s in shifts]
    out["summary_rule"] = SUMMARY_RULE.format(n=pairs, seed=seed)
    return out


def pair_rows(n: int, sentence: str, sentence_vs: str, token: str, rows: Sequence[Any]) -> list[dict[str, Any]]:
    """The rows of pair number ``n`` in ``compare --pairs --json``: each head's row
    (``HeadStats.to_dict``) after the pair's number, sentences and token."""
    meta = {"pair": n, "sentence": sentence, "sentence_vs": sentence_vs, "token": token}
    return [{**meta, **row.to_dict()} for row in rows]
