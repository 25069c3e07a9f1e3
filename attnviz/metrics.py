"""Per-head statistics of attention rows, and the head tables ``attnviz compare`` prints.

Pure numpy: every function takes arrays plus explicit positions or masks and returns
arrays or plain dicts. Nothing here touches a model, torch, rich or typer.

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
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import TokenNotFoundError, UsageError
from .result import Attention
from .tokens import Tokens, word_occurrences

# Sort keys of ``sort_rows``; True = largest first.
SORT_KEYS: dict[str, bool] = {"weight": True, "entropy": False, "sink": True, "distance": True, "delta": True}


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


def mean_distance(rows: np.ndarray, query: int | Sequence[int]) -> np.ndarray:
    """(...) expected distance in tokens from the query to what it attends to.

    ``sum_j p_j · d_j``, with d_j = |j - q| from the nearest piece q of the query (0 on
    the query itself). Special tokens count like any other, so a head parked on [CLS]
    from the end of a sentence has a long mean distance.
    """
    rows = np.asarray(rows, dtype=np.float64)
    positions = np.arange(rows.shape[-1])
    span = np.asarray(_span(query))
    d = np.abs(positions[:, None] - span[None, :]).min(axis=1)  # (S,)
    return (rows * d).sum(-1)


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


# --- targets -------------------------------------------------------------------------


def find_targets(tokens: Tokens, words: Sequence[str], where: str = "the sentence") -> dict[str, tuple[int, ...]]:
    """Token positions of each target word, keyed by the word as given.

    ``word`` covers every occurrence (their pieces summed); ``word:N`` only the N-th
    (1-based). Matching is ``tokens.word_occurrences``: on the text, case-insensitive.

    Raises:
        TokenNotFoundError: a word is not in the sentence, or N is out of range; the
            message names ``where`` and lists the sentence's tokens.
    """
    out: dict[str, tuple[int, ...]] = {}
    for spec in words:
        word, occurrence = parse_target(spec)
        matches = word_occurrences(tokens, word)
        if not matches:
            raise TokenNotFoundError(
                f"target {word!r} is not in {where}; its tokens are: {tokens.describe()}",
                hint="pick a --target word from that list",
            )
        if occurrence is not None:
            if occurrence > len(matches):
                times = "once" if len(matches) == 1 else f"{len(matches)} times"
                raise TokenNotFoundError(
                    f"target {spec!r} is out of range: {word!r} occurs {times} in {where}",
                    hint=f"use {word}:1..{len(matches)}, or {word} for all occurrences",
                )
            matches = [matches[occurrence - 1]]
        out[spec] = tuple(sorted({i for m in matches for i in m}))
    return out


def parse_target(spec: str) -> tuple[str, int | None]:
    """'street' -> ('street', None); 'the:2' -> ('the', 2)."""
    m = re.fullmatch(r"(.+?):(\d+)", spec.strip())
    if m is None:
        return spec.strip(), None
    if int(m[2]) < 1:
        raise UsageError(f"target {spec!r}: occurrences count from 1", hint=f"use {m[1]}:1 for the first")
    return m[1], int(m[2])


# --- tables --------------------------------------------------------------------------


def query_rows(att: Attention, query: int | Sequence[int]) -> np.ndarray:
    """(N, H, S) float64: the query word's rows, the mean of its pieces' rows."""
    return np.asarray(np.mean([att.rows(q) for q in _span(query)], axis=0, dtype=np.float64))


def head_table(
    att: Attention, query: int | Sequence[int], targets: Sequence[str] = (), top: int = 3
) -> list[dict[str, Any]]:
    """One plain dict per (layer, head) describing where the query word attends.

    Keys: ``layer``, ``head``, ``top`` ([label, weight] of the ``top`` largest),
    ``top_index`` (their positions), ``targets`` ({word: weight}), ``entropy``,
    ``sink``, ``self``, ``prev``, ``next``, ``distance``. Rows come in (layer, head)
    order; see ``sort_rows``. See the module docstring for split words and targets.

    Raises:
        TokenNotFoundError: a target is not in the sentence.
    """
    span = _span(query)
    rows = query_rows(att, span)  # (N, H, S)
    size = rows.shape[-1]
    keys = att.keys  # the source tokens for cross-attention
    found = find_targets(keys, targets)
    mask = causal_mask(size, span) if att.provenance.causal else None
    stats: dict[str, np.ndarray | None] = {
        "entropy": entropy(rows, mask),
        "sink": sink(rows, keys.special),
    }
    # Self, neighbour and distance shares compare query and key positions: they mean
    # something only when both index the same text (None for cross-attention).
    positional = att.is_self_attention
    stats["self"] = self_share(rows, span) if positional else None
    stats["prev"] = prev_share(rows, span) if positional else None
    stats["next"] = next_share(rows, span) if positional else None
    stats["distance"] = mean_distance(rows, span) if positional else None
    weights = {word: target_weight(rows, idx) for word, idx in found.items()}
    top_idx, top_w = top_k(rows, top)
    labels = keys.labels
    out: list[dict[str, Any]] = []
    for n, layer in enumerate(att.layers):
        for h in range(rows.shape[1]):
            out.append(
                {
                    "layer": int(layer),
                    "head": h,
                    "top": [[labels[i], float(w)] for i, w in zip(top_idx[n, h], top_w[n, h])],
                    "top_index": [int(i) for i in top_idx[n, h]],
                    "targets": {word: float(w[n, h]) for word, w in weights.items()},
                    **{key: None if value is None else float(value[n, h]) for key, value in stats.items()},
                }
            )
    return out


def pair_table(
    att_a: Attention,
    query_a: int | Sequence[int],
    att_b: Attention,
    query_b: int | Sequence[int],
    targets: Sequence[str],
    top: int = 3,
) -> list[dict[str, Any]]:
    """The same query word in two sentences (a minimal pair), head by head.

    Targets are found by text in each sentence separately, so they may sit at other
    positions in B. Each row is ``head_table``'s row for A plus ``targets_vs`` (B's
    target weights), ``delta`` (B - A per target), ``top_vs``, ``entropy_vs`` and
    ``sink_vs``.

    Raises:
        UsageError: no targets, or the two results do not cover the same layers/heads.
        TokenNotFoundError: a target missing from either sentence.
    """
    if not targets:
        raise UsageError("comparing two sentences needs a --target word", hint="add --target WORD (repeatable)")
    if att_a.layers != att_b.layers or att_a.num_heads != att_b.num_heads:
        raise UsageError(
            f"the two results cover different heads: layers {list(att_a.layers)} × {att_a.num_heads} heads "
            f"vs {list(att_b.layers)} × {att_b.num_heads} heads",
            hint="run both sentences through the same model and --layer",
        )
    rows_a = head_table(att_a, query_a, targets, top)
    # Check B's targets with its own wording, so a word missing only from B says so.
    find_targets(att_b.keys, targets, where="the --vs sentence")
    rows_b = head_table(att_b, query_b, targets, top)
    out: list[dict[str, Any]] = []
    for a, b in zip(rows_a, rows_b):
        row = dict(a)
        row["targets_vs"] = dict(b["targets"])
        row["delta"] = {word: b["targets"][word] - a["targets"][word] for word in a["targets"]}
        row["top_vs"] = b["top"]
        row["entropy_vs"] = b["entropy"]
        row["sink_vs"] = b["sink"]
        out.append(row)
    return out


def sort_key(row: Mapping[str, Any], by: str) -> float:
    """The number ``sort_rows`` orders ``row`` by."""
    if by == "weight":
        targets = row["targets"]
        return float(next(iter(targets.values()))) if targets else float(row["top"][0][1])
    if by == "delta":
        if "delta" not in row:
            raise UsageError("--sort delta needs two sentences", hint="add --vs SENTENCE, or sort by weight")
        return max((abs(d) for d in row["delta"].values()), default=0.0)
    if row[by] is None:
        raise UsageError(
            f"cannot sort by {by}: it compares query and key positions, and cross-attention's keys are another text",
            hint="sort by weight, entropy or sink",
        )
    return float(row[by])


def sort_rows(rows: Sequence[Mapping[str, Any]], by: str | None = None, limit: int | None = None) -> list[Any]:
    """Rows ordered by ``by``, best first, then cut to ``limit``.

    ``weight``: the first target's weight (the top weight without targets), largest
    first; ``entropy``: most focused first; ``sink``, ``distance``: largest first;
    ``delta``: the largest change on any target (pairs only). Default: ``delta`` for
    pair rows, else ``weight``. Ties keep (layer, head) order.

    Raises:
        UsageError: an unknown key, or a limit below 1.
    """
    if by is None:
        by = "delta" if rows and "delta" in rows[0] else "weight"
    if by not in SORT_KEYS:
        raise UsageError(f"cannot sort by {by!r}", hint="use --sort " + "|".join(SORT_KEYS))
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}", hint="drop --limit to see every head")
    sign = -1.0 if SORT_KEYS[by] else 1.0
    ordered = sorted(rows, key=lambda row: sign * sort_key(row, by))  # stable: ties keep order
    return ordered[:limit] if limit is not None else ordered
