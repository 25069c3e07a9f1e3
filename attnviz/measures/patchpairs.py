"""Patching over many minimal pairs: each head's mean effect with a bootstrap interval.

One pair's effects (patching.py) are noisy: a head that restores 0.4 of one pair's logit
difference may restore nothing on the next. Over a file of pairs (clean, corrupted, and
the answer and wrong tokens of each), every pair is patched on its own (its alignment, its
scored position, its metric normalised by its own clean and corrupted runs), and each head
gets the mean of its normalised effects with a percentile bootstrap interval over the
pairs (Efron & Tibshirani 1993): the pairs are resampled with replacement ``resamples``
times and the interval holds the central ``level`` of the resampled means. A pair whose
clean and corrupted runs score the same has no normalised effect (NaN) and counts for no
head: ``count`` says how many pairs each mean is over.

Every pair is tokenized, aligned and has its answers looked up before the first forward
pass, so a bad line is refused (naming its file and line) before any model work.
Ctrl-C stops between pairs (or within one): the pairs done come back, marked partial.

A pairs file is JSON Lines (``{"clean": ..., "corrupted": ..., "answer": ..., "wrong":
...}``, answer and wrong optional) or tab-separated with a header naming its columns,
``clean <TAB> corrupted [<TAB> answer [<TAB> wrong]]``. Every pair gives the same fields.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Reason, UsageError
from ..io.models import shareable_name
from .patching import DIRECTIONS, Metric, PatchResult, answer_id, choose_metric, patch_heads
from .patchresult import _numbers

if TYPE_CHECKING:
    from ..engines import Engine
    from ..select import Query
    from ..tokens import Tokens
    from .lm import LMHead

COLUMNS = ("clean", "corrupted", "answer", "wrong")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
RESAMPLES = 1000
LEVEL = 0.95

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class PatchPair:
    """One line of a pairs file: the two prompts and the metric's tokens (None: not given)."""

    clean: str
    corrupted: str
    answer: str | None = None
    wrong: str | None = None
    where: str = ""  # "file:line", for messages


# --- reading ------------------------------------------------------------------------------


def read_patch_pairs(path: Path | str) -> list[PatchPair]:
    """The pairs of a JSONL (.jsonl, .ndjson) or tab-separated file.

    Raises:
        UsageError: (reason "patch_pair") unreadable, too big, not UTF-8, a bad line, a
            missing or empty field, pairs that do not all give the same fields, or no pair;
            each naming the file and line.
    """
    from ..io.safeio import read_lines

    path = Path(path)
    jsonl = path.suffix.lower() in JSONL_SUFFIXES
    rows = (
        _jsonl_rows(path, read_lines(path, "JSON Lines pairs file"))
        if jsonl
        else _tsv_rows(path, read_lines(path, "tab-separated pairs file"))
    )
    pairs: list[PatchPair] = []
    for where, cells in rows:
        for name in ("clean", "corrupted"):
            if not cells.get(name):
                raise UsageError(f"{where}: no {name} prompt", hint=_HINT, reason=Reason.PATCH_PAIR)
        pair = PatchPair(cells["clean"], cells["corrupted"], cells.get("answer"), cells.get("wrong"), where)
        if pairs and (pair.answer is None, pair.wrong is None) != (pairs[0].answer is None, pairs[0].wrong is None):
            raise UsageError(
                f"{where}: this pair gives {_fields(pair)}, the first one ({pairs[0].where}) {_fields(pairs[0])}",
                hint="every pair gives the same fields: one metric scores them all",
                reason=Reason.PATCH_PAIR,
            )
        if pair.wrong is not None and pair.answer is None:
            raise UsageError(f"{where}: a wrong token without an answer", hint=_HINT, reason=Reason.PATCH_ANSWER)
        pairs.append(pair)
    if not pairs:
        raise UsageError(f"{str(path)!r} holds no pairs", hint=_HINT, reason=Reason.PATCH_PAIR)
    return pairs


_HINT = (
    'one pair a line: {"clean": ..., "corrupted": ..., "answer": ..., "wrong": ...} (JSONL), '
    "or a TSV with the header clean<TAB>corrupted<TAB>answer<TAB>wrong"
)


def _fields(pair: PatchPair) -> str:
    return ", ".join(n for n in COLUMNS if getattr(pair, n) is not None)


def _tsv_rows(path: Path, lines: Iterator[tuple[int, str]]) -> Iterator[tuple[str, dict[str, str]]]:
    header: tuple[str, ...] | None = None
    for number, raw in lines:
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        cells = [cell.strip() for cell in raw.split("\t")]
        where = f"{path}:{number}"
        if header is None:
            names = tuple(c.lower() for c in cells)
            if not 2 <= len(names) <= 4 or names != COLUMNS[: len(names)]:
                raise UsageError(
                    f"{where}: expected a header like {' <TAB> '.join(COLUMNS)}", hint=_HINT, reason=Reason.PATCH_PAIR
                )
            header = names
            continue
        if len(cells) != len(header):
            raise UsageError(
                f"{where}: expected {len(header)} tab-separated columns ({', '.join(header)}), found {len(cells)}",
                hint=_HINT,
                reason=Reason.PATCH_PAIR,
            )
        if not all(cells):
            raise UsageError(f"{where}: a column is empty", hint=_HINT, reason=Reason.PATCH_PAIR)
        yield where, dict(zip(header, cells, strict=True))


def _jsonl_rows(path: Path, lines: Iterator[tuple[int, str]]) -> Iterator[tuple[str, dict[str, str]]]:
    from ..io.jsonread import loads

    for number, raw in lines:
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        record = loads(raw, f"{where}:", hint="one JSON object per line")
        if not isinstance(record, dict):
            raise UsageError(
                f"{where}: a JSON {type(record).__name__}, not an object", hint=_HINT, reason=Reason.PATCH_PAIR
            )
        unknown = sorted(set(record) - set(COLUMNS))
        if unknown:
            raise UsageError(f"{where}: unknown field {unknown[0]!r}", hint=_HINT, reason=Reason.PATCH_PAIR)
        for name, value in record.items():
            if not isinstance(value, str):
                raise UsageError(
                    f"{where}: {name!r} is a {type(value).__name__}, not a string", hint=_HINT, reason=Reason.PATCH_PAIR
                )
        yield where, {k: v for k, v in record.items() if v != ""}


# --- statistics ---------------------------------------------------------------------------


def bootstrap(
    effects: np.ndarray, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The mean over axis 0 of ``effects`` (P, ...) ignoring NaN, and the percentile
    bootstrap interval of that mean: pairs resampled with replacement ``resamples`` times.

    Returns:
        (mean, low, high, count), each of shape effects.shape[1:]; NaN where no pair counts.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), not {level}")
    p = effects.shape[0]
    count = np.isfinite(effects).sum(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: NaN, as documented
        mean = np.nanmean(effects, axis=0) if p else np.full(effects.shape[1:], np.nan)
        if p < 2 or resamples < 1:
            nan = np.full(effects.shape[1:], np.nan)
            return mean, nan, nan.copy(), count
        rng = np.random.default_rng(seed)
        means = np.empty((resamples, *effects.shape[1:]))
        step = max(1, 2**22 // max(1, effects.size))  # resamples per chunk: memory bounded
        for start in range(0, resamples, step):
            picks = rng.integers(0, p, size=(min(step, resamples - start), p))
            means[start : start + len(picks)] = np.nanmean(effects[picks], axis=1)
        tail = (1 - level) / 2 * 100
        low, high = np.nanpercentile(means, [tail, 100 - tail], axis=0)
    return mean, low, high, count


# --- the result ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PairsResult:
    """Every head's patching effect over a file of pairs.

    Attributes:
        model, engine, site, direction, metric: as for ``PatchResult``.
        pairs: the pairs patched (all of them unless ``partial``); total: how many the file held.
        effects: (P, N, H) (or (P, N) for a layer site) each pair's normalised effects.
        scores: (P, 2) each pair's clean and corrupted metric.
        mean, low, high: (N, H) the mean effect and its bootstrap interval; count: the pairs
            each mean is over (a pair whose runs score alike counts for none).
        resamples, level, seed: the bootstrap's settings.
        partial: interrupted: only ``pairs`` were patched.
    """

    model: str
    engine: str
    site: str
    direction: str
    metric: str
    pairs: tuple[PatchPair, ...]
    total: int
    effects: np.ndarray
    scores: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    count: np.ndarray
    resamples: int
    level: float
    seed: int
    partial: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def axes(self) -> tuple[str, ...]:
        return ("layer", "head") if self.mean.ndim == 2 else ("layer",)

    @property
    def num_layers(self) -> int:
        return int(self.mean.shape[0])

    def grid(self) -> tuple[np.ndarray, list[str], str]:
        """What a layers × columns heatmap draws (as ``PatchResult.grid``): the means."""
        if self.mean.ndim == 2:
            return self.mean, [f"H{h}" for h in range(self.mean.shape[1])], "each head's mean effect"
        return self.mean[:, None], [self.site], f"{self.site}'s mean effect"

    def unit_label(self, index: tuple[int, ...]) -> str:
        return f"L{index[0]}.H{index[1]}" if len(index) == 2 else f"L{index[0]} {self.site}"

    def ranked(self, top: int | None = None) -> list[tuple[str, float, float, float, int]]:
        """(label, mean, low, high, count) of every unit by |mean|, largest first; NaN left out."""
        rows = [index for index in np.ndindex(*self.mean.shape) if np.isfinite(self.mean[index])]
        rows.sort(key=lambda i: (-abs(float(self.mean[i])), i))
        out = [
            (self.unit_label(i), float(self.mean[i]), float(self.low[i]), float(self.high[i]), int(self.count[i]))
            for i in rows
        ]
        return out if top is None else out[:top]

    def what(self) -> str:
        """The label every view carries."""
        arrow = "corrupted run ← clean" if self.direction == "denoise" else "clean run ← corrupted"
        unit = "each head's z (output before W^O)" if self.site == "z" else f"each layer's {self.site}"
        return (
            f"patched: {unit}, one at a time, on each of {len(self.pairs)} pairs; {self.direction} ({arrow} "
            f"{self.site}); metric: {self.metric}, normalised per pair (0 = its corrupted run, 1 = its clean "
            f"run); mean over pairs with a {self.level:.0%} bootstrap interval ({self.resamples} resamples)"
        )

    def to_dict(self) -> dict[str, Any]:
        """The --json document."""
        return {
            "kind": "patch-pairs",
            "model": self.model,
            "engine": self.engine,
            "site": self.site,
            "direction": self.direction,
            "metric": self.metric,
            "label": self.what(),
            "axes": list(self.axes),
            "pairs": [
                {
                    "where": p.where,
                    "clean": p.clean,
                    "corrupted": p.corrupted,
                    "answer": p.answer,
                    "wrong": p.wrong,
                    "clean_score": _numbers(self.scores[i, 0]),
                    "corrupted_score": _numbers(self.scores[i, 1]),
                }
                for i, p in enumerate(self.pairs)
            ],
            "total": self.total,
            "mean": _numbers(self.mean),
            "low": _numbers(self.low),
            "high": _numbers(self.high),
            "count": self.count.tolist(),
            "effects": _numbers(self.effects),
            "resamples": self.resamples,
            "level": self.level,
            "seed": self.seed,
            "partial": self.partial,
            "notes": list(self.notes),
        }

    def to_npz(self) -> dict[str, np.ndarray]:
        return {
            "effects": self.effects,
            "scores": self.scores,
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "count": self.count,
            "label": np.array(self.what()),
        }


# --- the passes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """A pair ready to patch: tokens, scored position and metric."""

    pair: PatchPair
    clean: Tokens
    corrupted: Tokens
    metric: Metric
    position: int | None


def prepare_pairs(
    engine: Engine, pairs: Sequence[PatchPair], metric: str | None, query: Query | None
) -> tuple[list[Prepared], LMHead | None]:
    """Tokenize, align and look up every pair's answers: every refusal before a forward pass.

    Raises:
        UsageError: a pair without a sound alignment, a query word missing from a clean
            prompt, an answer that is not one token; each naming its file and line.
    """
    from .alignment import align
    from .lm import load_lm_head

    lm = None if engine.parts else load_lm_head(engine)
    if lm is not None and lm.kind != "causal":
        lm = None
    name = choose_metric(metric, pairs[0].answer, pairs[0].wrong, lm is not None)
    out = []
    for pair in pairs:
        try:
            clean, corrupted = engine.tokenize(pair.clean), engine.tokenize(pair.corrupted)
            align(clean.ids, corrupted.ids, clean.labels, corrupted.labels)
            at = None if query is None else query.resolve(clean, "the clean text")[-1]
            a = answer_id(engine.tokenizer, pair.answer) if pair.answer is not None else (None, None)
            w = answer_id(engine.tokenizer, pair.wrong) if pair.wrong is not None else (None, None)
            m = Metric(name, a[0], w[0], a[1], w[1])
        except UsageError as exc:  # the same error, naming the line
            exc.message = f"{pair.where}: {exc.message}"
            exc.args = (exc.message,)
            raise
        out.append(Prepared(pair, clean, corrupted, m, at))
    return out, lm


def patch_pairs(
    engine: Engine,
    pairs: Sequence[PatchPair],
    *,
    metric: str | None = None,
    direction: str = "denoise",
    site: str = "z",
    query: Query | None = None,
    layers: Sequence[int] | None = None,
    batch: int | None = None,
    progress: Progress | None = None,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
    results: Iterator[PatchResult] | None = None,
) -> PairsResult:
    """Patch every head (``site``) on each pair, then the mean per head with its bootstrap
    interval. ``results``: the pairs' ``PatchResult``s computed elsewhere (a Ray pool), in
    order; by default each pair is patched here, one after another.
    """
    if direction not in DIRECTIONS:
        raise UsageError(
            f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})", reason=Reason.PATCH_METRIC
        )
    prepared, lm = prepare_pairs(engine, pairs, metric, query)
    if results is None:
        results = (
            patch_heads(engine, p.clean, p.corrupted, p.metric, position=p.position, direction=direction,
                        layers=layers, batch=batch, lm=lm, site=site)
            for p in prepared
        )  # fmt: skip
    done: list[PatchResult] = []
    partial = False
    try:
        for result in results:
            if result.partial:
                partial = True
                break
            done.append(result)
            if progress is not None:
                progress(len(done), len(prepared))
    except KeyboardInterrupt:
        partial = True
    return summarise(engine, done, prepared, direction, site, partial, resamples, level, seed)


def summarise(
    engine: Engine,
    done: Sequence[PatchResult],
    prepared: Sequence[Prepared],
    direction: str,
    site: str,
    partial: bool,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> PairsResult:
    """The ``PairsResult`` of the pairs ``done`` (the first len(done) of ``prepared``)."""
    shape = engine.shape
    empty = (0, shape.num_layers, shape.num_heads) if site == "z" else (0, shape.num_layers)
    effects = np.stack([r.effect for r in done]) if done else np.zeros(empty)
    scores = np.array([[r.clean_score, r.corrupted_score] for r in done]).reshape(len(done), 2)
    mean, low, high, count = bootstrap(effects, resamples, level, seed)
    flat = [p.pair.where for p, r in zip(prepared, done) if r.clean_score == r.corrupted_score]
    notes = []
    if flat:
        notes.append(
            f"{len(flat)} pair(s) score alike clean and corrupted and count for no head: {', '.join(flat[:3])}"
        )
    if len(done) < 2:
        notes.append("an interval needs at least two pairs")
    return PairsResult(
        model=shareable_name(engine.files.spec),
        engine=engine.name,
        site=site,
        direction=direction,
        metric=prepared[0].metric.name,
        pairs=tuple(p.pair for p in prepared[: len(done)]),
        total=len(prepared),
        effects=effects,
        scores=scores,
        mean=mean,
        low=low,
        high=high,
        count=count,
        resamples=resamples,
        level=level,
        seed=seed,
        partial=partial,
        notes=tuple(notes),
    )
