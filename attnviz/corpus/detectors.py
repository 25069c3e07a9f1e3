"""Corpus-level per-head detectors as streaming, mergeable accumulators.

A *detector* asks of each head one question about where its queries put their
attention (previous token? [CLS]? an earlier copy of the same token?). For one text
the head's score is the mean, over the text's *eligible* queries, of the attention
mass on that detector's *target* keys:

    score(text, head) = (1 / |Q|) · Σ_{i ∈ Q} Σ_{j ∈ T(i)} A[head, i, j]

Over a corpus we keep, per (detector, layer, head), the count n of texts that had
at least one eligible query, the mean of their scores and M2 (the sum of squared
deviations) with Welford's update in the parallel form of Chan, Golub & LeVeque
(1979), so two accumulators (two batches, two Ray workers) merge exactly:

    n = n_a + n_b,  δ = μ_b − μ_a,  μ = μ_a + δ·n_b/n,  M2 = M2_a + M2_b + δ²·n_a·n_b/n

Only these three (D, N, H) arrays live across texts: memory is flat in corpus size.

Queries are the real, non-special tokens of a text (never [CLS]/[SEP]/BOS, never
padding). The detectors (formulas also in the README):

    previous     T(i) = {i−1}                              Q: i ≥ 1
    next         T(i) = {i+1}                              Q: i+1 < n (always 0 for decoders)
    self         T(i) = {i}
    sink         T(i) = special tokens ([CLS], [SEP], <s>); a text without any (GPT-2)
                 uses its first token, the attention sink of Xiao et al. (2023)
                                                           Q: i not a sink
    punctuation  T(i) = keys whose text is all Unicode punctuation (Clark et al. 2019)
    duplicate    T(i) = {j < i : id_j = id_i}              Q: queries with an earlier copy
    induction    T(i) = {j+1 : j+1 < i, id_j = id_i}       Q: queries with such a j
                 (Olsson et al. 2022; TransformerLens' detect_head "induction")
    local        T(i) = {j : |i − j| ≤ k}                  (k = local_k, default 2)
    entropy      −Σ_j p_ij log p_ij / log(v_i), v_i the keys query i may see
                 (metrics.entropy)                         Q: queries that see ≥ 2 keys

Pure numpy: nothing here touches a model, torch, rich or typer.
Shape legend: B texts in a batch, N layers, H heads, S tokens (padded), D detectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..result import jsonable
from ..tokens import is_punctuation

DETECTORS: tuple[str, ...] = (
    "previous",
    "next",
    "self",
    "sink",
    "punctuation",
    "duplicate",
    "induction",
    "local",
    "entropy",
)
DEFAULT_LOCAL_K = 2


@dataclass(frozen=True)
class TextFeatures:
    """What the detectors need to know of one text: its token ids, which tokens the
    tokenizer added, and which are punctuation. All of length S (unpadded)."""

    ids: tuple[int, ...]
    special: tuple[bool, ...]
    punctuation: tuple[bool, ...]

    def __post_init__(self) -> None:
        if not (len(self.ids) == len(self.special) == len(self.punctuation)):
            raise ValueError(
                f"ids ({len(self.ids)}), special ({len(self.special)}) and punctuation "
                f"({len(self.punctuation)}) must have one entry per token"
            )

    def __len__(self) -> int:
        return len(self.ids)


def features(ids: Sequence[int], special: Sequence[bool], labels: Sequence[str]) -> TextFeatures:
    """TextFeatures from ids, the special-token flags and readable token labels."""
    punct = tuple(not s and is_punctuation(label) for s, label in zip(special, labels))
    return TextFeatures(tuple(int(i) for i in ids), tuple(bool(s) for s in special), punct)


@dataclass(frozen=True)
class DetectorConfig:
    """Which detectors to run, and their one parameter."""

    detectors: tuple[str, ...] = DETECTORS
    local_k: int = DEFAULT_LOCAL_K

    def __post_init__(self) -> None:
        unknown = [d for d in self.detectors if d not in DETECTORS]
        if unknown:
            raise ValueError(f"unknown detector(s) {unknown}; known: {', '.join(DETECTORS)}")
        if not self.detectors:
            raise ValueError("no detectors chosen")
        if self.local_k < 0:
            raise ValueError(f"local_k={self.local_k} must be at least 0")


# Float64 elements one scoring step holds (a block of query rows' weights, each detector's
# targets of those rows and the entropy's temporaries), whatever the text's length: 2^22,
# 32 MiB a kind. Scoring whole (S, S) matrices took 9.7 GB for one 8,183-token text (issue 38).
SCORE_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class _Positions:
    """One text's per-position facts, padded to S: all a detector's rows are made of."""

    n: int
    ids: np.ndarray  # (S,) int64, -1 on padding
    real: np.ndarray  # (S,) bool
    punct: np.ndarray  # (S,) bool
    base_q: np.ndarray  # (S,) bool: real, not special
    sinks: np.ndarray  # (S,) bool
    queries: np.ndarray  # (D, S) bool: each detector's eligible queries


def _positions(text: TextFeatures, size: int, config: DetectorConfig) -> _Positions:
    n = len(text)
    if size < n:
        raise ValueError(f"size {size} is shorter than the text ({n} tokens)")
    ids = np.full(size, -1, dtype=np.int64)
    ids[:n] = text.ids
    real = np.arange(size) < n  # (S,)
    special = np.zeros(size, dtype=bool)
    special[:n] = text.special
    punct = np.zeros(size, dtype=bool)
    punct[:n] = text.punctuation
    base_q = real & ~special  # (S,)
    sinks = special if special[:n].any() else (np.arange(size) == 0) & real
    # Queries with an earlier (non-special) copy of their id, and with one at least two
    # before them (induction's key, right after the copy, is then strictly before the
    # query): the first copy decides both. O(S), where the (S, S) table was S² bools.
    first: dict[int, int] = {}
    earlier = np.full(size, size, dtype=np.int64)  # (S,) the first copy's position
    for i in np.flatnonzero(base_q):
        earlier[i] = first.setdefault(int(ids[i]), int(i))
    position = np.arange(size)
    has_copy = base_q & (earlier < position)
    has_induction = base_q & (earlier < position - 1)
    table = {
        "previous": base_q & (position >= 1),
        "next": base_q & (position + 1 < n),
        "self": base_q,
        "sink": base_q & ~sinks,
        "punctuation": base_q,
        "duplicate": has_copy,
        "induction": has_induction,
        "local": base_q,
        "entropy": base_q,  # and seeing two keys at least: ``_entropy_queries``
    }
    queries = np.stack([table[d] for d in config.detectors])  # (D, S)
    return _Positions(n, ids, real, punct, base_q, sinks, queries)


def _row_targets(
    t: _Positions, start: int, stop: int, causal: bool, config: DetectorConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Rows start..stop-1 of every detector's targets (D, l, S) bool, and of the keys each
    query may see (l, S) bool: ``detector_masks``'s tables cut to those rows."""
    size = len(t.ids)
    i = np.arange(start, stop)[:, None]  # (l, 1) query position
    j = np.arange(size)[None, :]  # (1, S) key position
    visible = t.real[start:stop, None] & t.real[None, :]  # (l, S)
    if causal:
        visible &= j <= i
    rows = t.base_q[start:stop, None]
    # Earlier copies of the same (non-special) token id.
    same = (t.ids[start:stop, None] == t.ids[None, :]) & rows & t.base_q[None, :] & (j < i)  # (l, S)
    # Induction: the key right after an earlier copy, itself strictly before the query.
    after_copy = np.zeros_like(same)
    after_copy[:, 1:] = same[:, :-1]
    after_copy &= j < i
    make = {
        "previous": lambda: (j == i - 1) & visible,
        "next": lambda: (j == i + 1) & visible,
        "self": lambda: (j == i) & visible,
        "sink": lambda: t.sinks[None, :] & visible,
        "punctuation": lambda: t.punct[None, :] & visible,
        "duplicate": lambda: same,
        "induction": lambda: after_copy,
        "local": lambda: (np.abs(i - j) <= config.local_k) & visible,
        "entropy": lambda: np.zeros_like(visible),
    }
    return np.stack([make[d]() for d in config.detectors]), visible  # (D, l, S), (l, S)


def detector_masks(
    text: TextFeatures, size: int, causal: bool, config: DetectorConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The eligible queries and target keys of every detector for one text.

    Args:
        text: the text (n tokens).
        size: S ≥ n, the padded length; positions n.. are padding.
        causal: the model is a decoder (query i sees keys 0..i).

    Returns:
        queries (D, S) bool, targets (D, S, S) bool (``targets[d, i, j]``: key j is a target
        of query i; all False for entropy, which has no targets) and visible (S, S) bool
        (the keys each query may attend to). (S, S) tables: the scoring itself takes them
        a block of rows at a time (``BlockScorer``).
    """
    t = _positions(text, size, config)
    targets, visible = _row_targets(t, 0, size, causal, config)
    return _entropy_queries(t, visible.sum(-1), config), targets, visible


def _entropy_queries(t: _Positions, seen: np.ndarray, config: DetectorConfig) -> np.ndarray:
    """``t.queries`` with entropy's row: queries that see at least two keys (``seen``: (S,))."""
    queries = t.queries.copy()
    if "entropy" in config.detectors:
        queries[config.detectors.index("entropy")] = t.base_q & (seen >= 2)
    return queries


class BlockScorer:
    """Per-text, per-head detector scores of one batch, fed a block of query rows at a
    time (``add``): what it holds is the (B, D, N, H) sums and one block, never a (S, S)
    matrix. The same numbers as scoring whole matrices, in float64.

    Args:
        texts: the B texts, unpadded; ``size``: S, their padded length.
        num_layers, num_heads: N and H of the weights to come.
        coref: per text, a coreference item or None: its pronoun's rows are kept (N, H, P, n).
    """

    def __init__(
        self,
        texts: Sequence[TextFeatures],
        size: int,
        causal: bool,
        config: DetectorConfig,
        num_layers: int,
        num_heads: int,
        coref: Sequence[CorefItem | None] = (),
    ) -> None:
        self.size, self.causal, self.config = size, causal, config
        self.num_heads = num_heads
        self._texts = [_positions(t, size, config) for t in texts]
        position = np.arange(size)
        queries = []
        for t in self._texts:
            seen = np.where(t.real, np.minimum(position + 1, t.n) if causal else t.n, 0)  # (S,) keys each row sees
            queries.append(_entropy_queries(t, seen, config))
        self.queries = np.stack(queries)  # (B, D, S)
        self.count = self.queries.sum(-1)  # (B, D)
        self.summed = np.zeros((len(texts), len(config.detectors), num_layers, num_heads))  # (B, D, N, H)
        self._entropy_at = config.detectors.index("entropy") if "entropy" in config.detectors else None
        items = list(coref) or [None] * len(texts)
        self.coref = items
        self.pronoun_rows = {
            b: np.zeros((num_layers, num_heads, len(item.pronoun), t.n))
            for b, (item, t) in enumerate(zip(items, self._texts, strict=True))
            if item is not None
        }  # b -> (N, H, P, n)

    def add(self, layer: int, start: int, weights: np.ndarray) -> None:
        """Fold in rows start.. of layer slot ``layer``: weights (B, H, l, S), any float dtype
        (rows of padding queries and columns of padding keys are ignored)."""
        b, h, length, size = weights.shape
        if (b, h, size) != (len(self._texts), self.num_heads, self.size) or start + length > self.size:
            raise ValueError(
                f"a block of rows {start}..{start + length} of shape {weights.shape} does not fit "
                f"{len(self._texts)} texts × {self.num_heads} heads × {self.size} tokens"
            )
        per_row = b * (5 * h + 2 * len(self.config.detectors)) * size
        step = max(1, SCORE_ELEMENTS // per_row)
        for r0 in range(0, length, step):
            r1 = min(length, r0 + step)
            self._score(layer, start + r0, np.asarray(weights[:, :, r0:r1], dtype=np.float64))
        for b_, rows in self.pronoun_rows.items():
            item = self.coref[b_]
            assert item is not None  # pronoun_rows holds the texts with an item
            for p, position in enumerate(item.pronoun):
                if start <= position < start + length:
                    rows[layer, :, p] = weights[b_, :, position - start, : rows.shape[-1]]

    def _score(self, layer: int, start: int, w: np.ndarray) -> None:
        """One block of rows start.. (w: (B, H, l, S) float64) into the sums."""
        stop = start + w.shape[2]
        made = [_row_targets(t, start, stop, self.causal, self.config) for t in self._texts]
        targets = np.stack([m[0] for m in made]).astype(np.float64)  # (B, D, l, S)
        # 1. Mass of each query row on each detector's targets.
        mass = np.einsum("bhqk,bdqk->bdhq", w, targets)  # (B, D, H, l)
        del targets
        if self._entropy_at is not None:
            # 2. Normalised entropy of each row over the keys it may see (as metrics.entropy).
            visible = np.stack([m[1] for m in made])  # (B, l, S)
            log_v = np.log(np.maximum(visible.sum(-1), 1))[:, None, :]  # (B, 1, l)
            p = np.where(visible[:, None], np.clip(w, 0.0, None), 0.0)  # (B, H, l, S)
            total = p.sum(-1, keepdims=True)
            p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
            ent = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)  # (B, H, l)
            ent = np.divide(ent, log_v, out=np.zeros_like(ent), where=log_v > 0)
            mass[:, self._entropy_at] = np.clip(ent, 0.0, 1.0)
        # 3. Summed over each text's eligible queries (the mean comes in ``scores``).
        self.summed[:, :, layer] += (mass * self.queries[:, :, None, start:stop]).sum(-1)  # (B, D, H)

    def scores(self) -> tuple[np.ndarray, np.ndarray]:
        """scores (B, D, N, H) float64: the mean over each text's eligible queries, and
        valid (B, D) bool: whether text b had an eligible query for detector d."""
        count = self.count[:, :, None, None]
        scores = np.divide(self.summed, count, out=np.zeros_like(self.summed), where=count > 0)
        return scores, self.count > 0

    def tally(self, layers: Sequence[int]) -> CorefTally | None:
        """The coreference tally of the texts with an item (None: none had one)."""
        if not self.pronoun_rows:
            return None
        tally = CorefTally.empty(layers, self.num_heads)
        for b, rows in self.pronoun_rows.items():
            item = self.coref[b]
            assert item is not None
            tally = tally.add_rows(rows, item)
        return tally


def text_scores(
    weights: np.ndarray | Sequence[np.ndarray], texts: Sequence[TextFeatures], causal: bool, config: DetectorConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Per-text, per-head detector scores of one batch.

    Args:
        weights: (N, B, H, S, S) attention weights of N layers for B texts padded to S, or
            a sequence of N (B, H, S, S) arrays (rows of padding queries and columns of
            padding keys are ignored).
        texts: the B texts, unpadded.

    Returns:
        scores (B, D, N, H) float64, and valid (B, D) bool: whether text b had an
        eligible query for detector d (its score is meaningless where not). Scored a block
        of rows at a time (``BlockScorer``): no float64 copy of a whole matrix.
    """
    shapes = {tuple(np.shape(layer)) for layer in weights}
    first = next(iter(shapes), ())
    if len(shapes) != 1 or len(first) != 4 or first[0] != len(texts) or first[2] != first[3]:
        raise ValueError(f"weights must be N × (B={len(texts)}, H, S, S), got {sorted(shapes)}")
    scorer = BlockScorer(texts, first[-1], causal, config, len(weights), first[1])
    for n, layer in enumerate(weights):
        scorer.add(n, 0, np.asarray(layer))
    return scorer.scores()


@dataclass(frozen=True)
class HeadAccumulator:
    """Running count, mean and M2 of per-text scores, per (detector, layer, head).

    Immutable: ``add`` and ``merge`` return a new accumulator (cheap: three small arrays).

    Attributes:
        detectors: D detector names, ``DETECTORS`` order.
        layers: N model layer indices.
        num_heads: H.
        count: (D,) texts scored per detector (the same for every head).
        mean: (D, N, H) float64.
        m2: (D, N, H) float64, sum of squared deviations from the mean.
    """

    detectors: tuple[str, ...]
    layers: tuple[int, ...]
    num_heads: int
    count: np.ndarray = field(repr=False)
    mean: np.ndarray = field(repr=False)
    m2: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        shape = (len(self.detectors), len(self.layers), self.num_heads)
        if self.count.shape != shape[:1] or self.mean.shape != shape or self.m2.shape != shape:
            raise ValueError(
                f"count {self.count.shape}, mean {self.mean.shape}, m2 {self.m2.shape} "
                f"do not fit {len(self.detectors)} detectors × {len(self.layers)} layers × {self.num_heads} heads"
            )

    @classmethod
    def empty(cls, detectors: Sequence[str], layers: Sequence[int], num_heads: int) -> HeadAccumulator:
        shape = (len(detectors), len(layers), num_heads)
        return cls(
            tuple(detectors),
            tuple(int(x) for x in layers),
            int(num_heads),
            np.zeros(len(detectors), dtype=np.int64),
            np.zeros(shape),
            np.zeros(shape),
        )

    def add(self, scores: np.ndarray, valid: np.ndarray) -> HeadAccumulator:
        """Fold in a batch: scores (B, D, N, H) and valid (B, D) from ``text_scores``."""
        valid = np.asarray(valid, dtype=bool)
        n = valid.sum(0).astype(np.int64)  # (D,)
        weight = valid[:, :, None, None].astype(np.float64)  # (B, D, 1, 1)
        safe_n = np.maximum(n, 1)[:, None, None].astype(np.float64)
        mean = (scores * weight).sum(0) / safe_n  # (D, N, H)
        m2 = (((scores - mean[None]) ** 2) * weight).sum(0)  # (D, N, H)
        batch = HeadAccumulator(self.detectors, self.layers, self.num_heads, n, mean, m2)
        return self.merge(batch)

    def merge(self, other: HeadAccumulator) -> HeadAccumulator:
        """The accumulator of both texts sets (Chan et al.'s parallel update)."""
        if (other.detectors, other.layers, other.num_heads) != (self.detectors, self.layers, self.num_heads):
            raise ValueError(
                f"cannot merge accumulators of different heads or detectors: "
                f"{self.detectors}/{self.layers}/{self.num_heads} vs {other.detectors}/{other.layers}/{other.num_heads}"
            )
        na = self.count.astype(np.float64)[:, None, None]
        nb = other.count.astype(np.float64)[:, None, None]
        n = na + nb
        safe = np.maximum(n, 1.0)
        delta = other.mean - self.mean
        mean = self.mean + delta * nb / safe
        m2 = self.m2 + other.m2 + delta**2 * na * nb / safe
        return HeadAccumulator(self.detectors, self.layers, self.num_heads, self.count + other.count, mean, m2)

    def joined(self, other: HeadAccumulator) -> HeadAccumulator:
        """This accumulator's detectors, then ``other``'s (the same heads: heads --ablate's
        effects beside the detectors)."""
        if (other.layers, other.num_heads) != (self.layers, self.num_heads):
            raise ValueError(f"cannot join accumulators of different heads: {self.layers} vs {other.layers}")
        return HeadAccumulator(
            (*self.detectors, *other.detectors),
            self.layers,
            self.num_heads,
            np.concatenate([self.count, other.count]),
            np.concatenate([self.mean, other.mean]),
            np.concatenate([self.m2, other.m2]),
        )

    @property
    def sd(self) -> np.ndarray:
        """(D, N, H) sample standard deviation over texts (0 with fewer than 2 texts)."""
        n = self.count.astype(np.float64)[:, None, None]
        var = np.divide(self.m2, n - 1, out=np.zeros_like(self.m2), where=n > 1)
        return np.sqrt(np.clip(var, 0.0, None))

    def rows(self) -> list[HeadScore]:
        """One row per (layer, head, detector), in (detector, layer, head) order."""
        sd = self.sd
        out: list[HeadScore] = []
        for d, name in enumerate(self.detectors):
            for n, layer in enumerate(self.layers):
                for h in range(self.num_heads):
                    out.append(
                        HeadScore(layer, h, name, float(self.mean[d, n, h]), float(sd[d, n, h]), int(self.count[d]))
                    )
        return out


@dataclass(frozen=True)
class HeadScore:
    """One head's score on one detector over a corpus."""

    layer: int
    head: int
    detector: str
    mean: float
    sd: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, rounded as every attnviz JSON is (``result.jsonable``); the CSV
        of ``attnviz heads --csv`` writes these values too."""
        return jsonable(
            {
                "layer": self.layer,
                "head": self.head,
                "detector": self.detector,
                "mean": self.mean,
                "sd": self.sd,
                "n": self.n,
            }
        )


def top_heads(acc: HeadAccumulator, detector: str, limit: int = 5) -> list[HeadScore]:
    """The ``limit`` heads with the highest mean on ``detector`` (lowest for entropy:
    the most focused heads), ties in (layer, head) order."""
    rows = [r for r in acc.rows() if r.detector == detector]
    sign = 1.0 if detector == "entropy" else -1.0
    return sorted(rows, key=lambda r: sign * r.mean)[:limit]


# --- coreference ---------------------------------------------------------------------


@dataclass(frozen=True)
class CorefItem:
    """One coreference example: the pronoun's token positions, the referent's, and every
    candidate's (the referent among them), in one tokenized text."""

    pronoun: tuple[int, ...]
    referent: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]
    special: tuple[bool, ...]

    def __post_init__(self) -> None:
        if not self.pronoun or not self.referent:
            raise ValueError("the pronoun and the referent need token positions")
        if self.referent not in self.candidates:
            raise ValueError("the referent must be one of the candidates")

    def nearest_is_referent(self) -> bool:
        """The baseline: the candidate nearest to the pronoun (ties: the earlier one)."""
        p = min(self.pronoun)

        def distance(c: tuple[int, ...]) -> tuple[int, int]:
            return (min(abs(p - i) for i in c), min(c))

        return min(self.candidates, key=distance) == self.referent


def coref_hits(weights: np.ndarray, item: CorefItem) -> np.ndarray:
    """(N, H) bool: each head's strongest non-special target from the pronoun lies in the
    referent (Clark et al. 2019, section 6: the head 'predicts' the key it attends to most).

    Args:
        weights: (N, H, S, S) attention of one text. A pronoun split into pieces uses the
            mean of its pieces' rows; the pronoun's own pieces are not candidate targets.
    """
    return coref_hits_rows(np.asarray(weights)[:, :, list(item.pronoun), :], item)


def coref_hits_rows(pronoun_rows: np.ndarray, item: CorefItem) -> np.ndarray:
    """``coref_hits`` from the pronoun's rows alone: (N, H, P, S) -> (N, H) bool."""
    rows = np.asarray(pronoun_rows, dtype=np.float64).mean(2)  # (N, H, S)
    excluded = np.asarray(item.special, dtype=bool).copy()
    excluded[list(item.pronoun)] = True
    rows = np.where(excluded[None, None, :], -np.inf, rows)
    best = rows.argmax(-1)  # (N, H)
    return np.isin(best, item.referent)


@dataclass(frozen=True)
class CorefTally:
    """Per-head coreference hits over examples, with the nearest-candidate baseline."""

    layers: tuple[int, ...]
    num_heads: int
    hits: np.ndarray = field(repr=False)  # (N, H) int64
    total: int = 0
    baseline_hits: int = 0

    @classmethod
    def empty(cls, layers: Sequence[int], num_heads: int) -> CorefTally:
        return cls(tuple(layers), num_heads, np.zeros((len(layers), num_heads), dtype=np.int64))

    def add(self, weights: np.ndarray, item: CorefItem) -> CorefTally:
        hits = self.hits + coref_hits(weights, item)
        return CorefTally(
            self.layers, self.num_heads, hits, self.total + 1, self.baseline_hits + int(item.nearest_is_referent())
        )

    def add_rows(self, pronoun_rows: np.ndarray, item: CorefItem) -> CorefTally:
        """``add`` from the pronoun's rows (N, H, P, S) alone."""
        hits = self.hits + coref_hits_rows(pronoun_rows, item)
        return CorefTally(
            self.layers, self.num_heads, hits, self.total + 1, self.baseline_hits + int(item.nearest_is_referent())
        )

    def merge(self, other: CorefTally) -> CorefTally:
        if (other.layers, other.num_heads) != (self.layers, self.num_heads):
            raise ValueError("cannot merge coreference tallies of different heads")
        return CorefTally(
            self.layers,
            self.num_heads,
            self.hits + other.hits,
            self.total + other.total,
            self.baseline_hits + other.baseline_hits,
        )

    @property
    def accuracy(self) -> np.ndarray:
        """(N, H) share of examples each head gets right (0 with no examples)."""
        return self.hits / max(self.total, 1)

    @property
    def baseline(self) -> float:
        return self.baseline_hits / max(self.total, 1)
