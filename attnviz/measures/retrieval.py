"""Copy and retrieval scores of heads during generation (Wu et al. 2024, "Retrieval Head
Mechanistically Explains Long-Context Factuality", section 2).

At each decoding step the model chooses token w from the last query's logits. A head
*copies* at that step when its strongest key (the argmax of its weight row) holds w:

    copy score(h)      = steps where the token at argmax(row_h) is w  /  steps

Wu et al.'s retrieval score asks more: the key must also lie inside the needle span
[start, stop) of a needle-in-a-haystack prompt, and the count is divided by the needle's
length (their ``retrieval_calculate``: each such step adds 1 / (stop - start)):

    retrieval score(h) = steps where start ≤ argmax(row_h) < stop and the token there is w
                         /  (stop - start)

The rows that choose written token i are the last given token's (``first_rows``) for i = 0
and written token i-1's (``rows[i - 1]``) after it. A step's rows may be kept whole,
(layers, H, S) weights, or as each head's strongest key only, (layers, H) key indices: the
probe keeps the latter, so its memory does not grow with the length.

Pure numpy; nothing here touches a model. Shapes: N layers (kept), H heads, S keys,
T written tokens, A lengths, B depths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class Written(Protocol):
    """What a ``generation.Generation`` holds that the scores read."""

    @property
    def ids(self) -> list[int]: ...
    @property
    def rows(self) -> list[Any]: ...
    @property
    def first_rows(self) -> Any: ...
    @property
    def prompt(self) -> Any: ...


def strongest_keys(rows: Any) -> np.ndarray:
    """(N, H) int: each head's argmax key, from (N, H, S) weights or (N, H) keys already.
    Ties go to the first key, as torch's argmax and topk(1) give them."""
    array = np.asarray(rows)
    return array.argmax(axis=-1) if array.ndim == 3 else array.astype(np.int64)


def choosing_keys(gen: Written) -> list[np.ndarray]:
    """Per written token i, (N, H): the strongest key of the query whose logits chose it."""
    if not gen.ids:
        return []
    if gen.first_rows is None:
        raise ValueError("this generation kept no rows of its last given token")
    return [strongest_keys(r) for r in [gen.first_rows, *gen.rows[: len(gen.ids) - 1]]]


def hits(keys: np.ndarray, context: np.ndarray, token: int, span: tuple[int, int] | None = None) -> np.ndarray:
    """(N, H) bool: the heads whose strongest key ``keys`` (N, H) holds ``token`` in
    ``context`` (S,) token ids, and lies in [start, stop) when a ``span`` is given."""
    hit = context[keys] == token  # (N, H)
    if span is not None:
        hit &= (keys >= span[0]) & (keys < span[1])
    return hit


def step_hits(gen: Written, span: tuple[int, int] | None = None) -> np.ndarray:
    """(T, N, H) bool: ``hits`` at every step of a generation."""
    context = np.asarray([*gen.prompt.ids, *gen.ids], dtype=np.int64)  # (P + T,)
    keys = choosing_keys(gen)
    if not keys:
        return np.zeros((0, 0, 0), dtype=bool)
    return np.stack([hits(k, context, int(w), span) for k, w in zip(keys, gen.ids, strict=True)])


def copy_scores(gen: Written) -> np.ndarray:
    """(N, H) float: per head, the fraction of steps whose strongest key holds the token
    written at that step (0 for a generation of no tokens)."""
    steps = step_hits(gen)
    if steps.shape[0] == 0:
        n, h = strongest_keys(gen.first_rows).shape if gen.first_rows is not None else (0, 0)
        return np.zeros((n, h))
    return steps.mean(axis=0)


def retrieval_counts(gen: Written, span: tuple[int, int]) -> np.ndarray:
    """(N, H) int: the steps Wu et al.'s rule counts for each head (divide by the needle's
    length, ``span[1] - span[0]``, for the retrieval score)."""
    steps = step_hits(gen, span)
    return steps.sum(axis=0) if steps.shape[0] else np.zeros_like(strongest_keys(gen.first_rows))


@dataclass(frozen=True)
class CaseScore:
    """One needle-in-a-haystack case: which length and depth, the counted steps per head,
    and how much of the needle the model wrote back."""

    length: int  # index into RetrievalReport.lengths
    depth: int  # index into RetrievalReport.depths
    counts: np.ndarray  # (N, H) int: steps counted by the rule
    needle: int  # the needle's length in tokens
    copied: int  # written tokens equal to the needle's, position by position
    tokens: int  # the prompt's length in tokens


@dataclass
class RetrievalReport:
    """Retrieval scores of every head over lengths × depths (NaN where a case did not run).

    Attributes:
        layers: the model layers scored (N); heads: H.
        lengths: the prompts' lengths in tokens (A); depths: the needle's depths, 0..1 (B).
        scores: (A, B, N, H) retrieval score per case.
        copied: (A, B) the fraction of the needle the model wrote back in each case.
    """

    layers: tuple[int, ...]
    heads: int
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    needle: int
    scores: np.ndarray = field(init=False)
    copied: np.ndarray = field(init=False)
    cases: int = 0
    partial: bool = False
    seconds: float = 0.0

    def __post_init__(self) -> None:
        shape = (len(self.lengths), len(self.depths))
        self.scores = np.full((*shape, len(self.layers), self.heads), np.nan)
        self.copied = np.full(shape, np.nan)

    def add(self, case: CaseScore) -> None:
        self.scores[case.length, case.depth] = case.counts / max(case.needle, 1)
        self.copied[case.length, case.depth] = case.copied / max(case.needle, 1)
        self.cases += 1

    def per_length(self) -> np.ndarray:
        """(A, N, H): the mean over the depths that ran at each length (NaN: none ran)."""
        return _nanmean(self.scores, axis=1)

    def recall(self) -> np.ndarray:
        """(A,): the fraction of the needle the model wrote back, mean over depths."""
        return _nanmean(self.copied, axis=1)

    def overall(self) -> np.ndarray:
        """(N, H): the mean over every case that ran."""
        return _nanmean(self.scores.reshape(-1, len(self.layers), self.heads), axis=0)

    def ranking(self, top: int | None = None) -> list[tuple[int, int]]:
        """(layer, head) pairs, best mean score first (ties: lower layer, then head)."""
        mean = np.nan_to_num(self.overall(), nan=-1.0)
        order = sorted(
            ((layer, h) for layer in range(len(self.layers)) for h in range(self.heads)),
            key=lambda lh: (-mean[lh], lh),
        )
        chosen = order if top is None else order[:top]
        return [(self.layers[slot], h) for slot, h in chosen]

    def head_depths(self, layer: int, head: int) -> np.ndarray:
        """(A, B): one head's score over lengths × depths (the heatmap)."""
        return self.scores[:, :, self.layers.index(layer), head]

    def to_dict(self) -> dict[str, Any]:
        per_length = self.per_length()
        overall = self.overall()
        return {
            "probe": "retrieval",
            "rule": "Wu et al. 2024: steps whose argmax key lies in the needle and holds the written token, "
            "/ needle tokens",
            "lengths": list(self.lengths),
            "depths": list(self.depths),
            "needle_tokens": self.needle,
            "cases": self.cases,
            "partial": self.partial,
            "copied": _listed(self.copied),
            "heads": [
                {
                    "layer": layer,
                    "head": h,
                    "score": _num(overall[self.layers.index(layer), h]),
                    "per_length": [_num(v) for v in per_length[:, self.layers.index(layer), h]],
                    "cases": _listed(self.head_depths(layer, h)),
                }
                for layer, h in self.ranking()
            ],
        }


def _nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    ran = ~np.isnan(values)
    count = ran.sum(axis=axis)
    total = np.where(ran, values, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _num(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 6)


def _listed(values: np.ndarray) -> list[Any]:
    return [_listed(v) for v in values] if values.ndim > 1 else [_num(v) for v in values]


def parse_lengths(text: str) -> tuple[int, ...]:
    """'1k,4k,32k' -> (1024, 4096, 32768); plain numbers are tokens. Raises ValueError."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = 1024 if part.endswith("k") else 1
        digits = part[:-1] if part.endswith("k") else part
        if not digits.isdigit() or int(digits) == 0:
            raise ValueError(f"{part!r} is not a positive number of tokens")
        out.append(int(digits) * scale)
    return tuple(out)


def parse_depths(text: str) -> tuple[float, ...]:
    """'0,0.25,0.5' -> (0.0, 0.25, 0.5); each in [0, 1]. Raises ValueError."""
    out = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a number") from None
        if not 0 <= value <= 1:
            raise ValueError(f"{value:g} is not a depth in [0, 1]")
        out.append(value)
    return tuple(out)


def described(values: Sequence[int]) -> str:
    """(1024, 4096) -> '1k, 4k'."""
    return ", ".join(f"{v // 1024}k" if v % 1024 == 0 else str(v) for v in values)
