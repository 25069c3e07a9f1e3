"""The scan loop of ``attnviz heads``: tokenizing, batching, one padded forward pass a
batch, and the per-head accumulators folded in (corpus.detectors).

The scan keeps only the per-head accumulators and a window of a few batches (sorted by
length so that batches pad little): memory is flat in the corpus size.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TokenNotFoundError, UsageError
from ..measures.base import MEASURES, measure_named
from ..result import Provenance, provenance_fields
from ..select import parse_target
from ..tokens import Tokens, tokenize, word_occurrences
from .detectors import (
    BlockScorer,
    CorefItem,
    CorefTally,
    DetectorConfig,
    HeadAccumulator,
    HeadScore,
    TextFeatures,
    features,
)
from .sources import CorefSpec, CorpusText

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ..engines import Engine


@dataclass(frozen=True)
class ScanOptions:
    """How to scan: which layers, batch size, detectors, and what to do with long texts."""

    layers: tuple[int, ...]
    batch_size: int = 16
    truncate: bool = False
    config: DetectorConfig = field(default_factory=DetectorConfig)
    window: int = 8  # batches held and sorted by length (padding waste vs memory)
    # The norm measure: detectors read each row's norm shares ‖α·f(x)‖ / row sum (attnviz.measures.norms).
    measure: str = "weight"
    # Head ablation beside the detectors (heads --ablate): "zero" or "mean"; the
    # queries ("all" real tokens or the "last"); mean-ablation's corpus means (N, H, D).
    ablate: str | None = None
    query_rule: str = "all"
    fill: np.ndarray | None = field(default=None, repr=False)
    # Bytes a batch's forward pass and scoring may take (None: the memory free now);
    # a batch over it is split, one text over it refused (engines.memory.estimate_scan).
    max_memory: int | None = None

    @property
    def accumulated(self) -> tuple[str, ...]:
        """What the accumulator holds: the detectors, and "ablation" last with --ablate."""
        return (*self.config.detectors, "ablation") if self.ablate is not None else self.config.detectors

    def __post_init__(self) -> None:
        if self.measure not in MEASURES:
            raise UsageError(f"unknown measure {self.measure!r} (known: {', '.join(MEASURES)})", hint=None)
        if self.batch_size < 1:
            raise UsageError(f"batch size must be at least 1, got {self.batch_size}", hint=None)
        if not self.layers:
            raise UsageError("no layers to scan", hint=None)
        if self.window < 1:
            raise ValueError(f"window={self.window} must be at least 1")


@dataclass(frozen=True)
class Prepared:
    """A tokenized text, its detector features and, for a coreference example, its item."""

    tokens: Tokens
    features: TextFeatures
    coref: CorefItem | None = None
    where: str = ""  # the text's place in the corpus, for messages


@dataclass(frozen=True)
class ScanReport:
    """What a scan found, and how much of the corpus it covered."""

    heads: HeadAccumulator
    coref: CorefTally | None
    texts: int  # texts scored
    skipped: int  # longer than the model's positions, skipped
    skipped_where: tuple[str, ...]  # the first few of them
    truncated: int
    seconds: float
    partial: bool = False  # interrupted: covers the texts scored so far


def report_dict(report: ScanReport, provenance: Provenance, measure: str = "weight") -> dict[str, Any]:
    """The JSON of ``attnviz heads --json``: provenance (``result.provenance_fields``'s
    shape, as show and compare), coverage, and every (layer, head, detector, mean, sd, n)
    row; coreference accuracy when there was any; ``measure``: what the detectors read
    (a measure whose rows do not sum to one: each row's shares). Rounded by ``result.jsonable``."""
    header = provenance_fields(provenance)
    out: dict[str, Any] = {
        **{key: header[key] for key in ("model", "engine", "device", "dtype")},
        "layers": list(report.heads.layers),
        "num_heads": report.heads.num_heads,
        "detectors": list(report.heads.detectors),
        "measure": measure,
        "texts": report.texts,
        "skipped": report.skipped,
        "truncated": report.truncated,
        "partial": report.partial,
        "seconds": round(report.seconds, 3),
        "scores": [row.to_dict() for row in report.heads.rows()],
        "provenance": header["provenance"],
    }
    if report.coref is not None:
        out["coreference"] = {
            "examples": report.coref.total,
            "baseline_nearest": report.coref.baseline,
            "heads": [row.to_dict() for row in coref_rows(report.coref)],
        }
    return out


def coref_rows(tally: CorefTally) -> list[HeadScore]:
    """Coreference as (layer, head, 'coreference', accuracy, sd of the 0/1 hits, n) rows."""
    n = tally.total
    out = []
    for i, layer in enumerate(tally.layers):
        for h in range(tally.num_heads):
            p = float(tally.accuracy[i, h])
            sd = (p * (1 - p) * n / (n - 1)) ** 0.5 if n > 1 else 0.0
            out.append(HeadScore(layer, h, "coreference", p, sd, n))
    return out


def report_csv(report: ScanReport) -> str:
    """CSV with a header: layer,head,detector,mean,sd,n, one row per (layer, head,
    detector), coreference rows last."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["layer", "head", "detector", "mean", "sd", "n"])
    rows = report.heads.rows() + (coref_rows(report.coref) if report.coref is not None else [])
    for row in rows:
        d = row.to_dict()
        writer.writerow([d["layer"], d["head"], d["detector"], d["mean"], d["sd"], d["n"]])
    return buffer.getvalue()


def prepare(tokens: Tokens, coref: CorefItem | None = None, where: str = "") -> Prepared:
    return Prepared(tokens, features(tokens.ids, tokens.special, tokens.labels), coref, where)


def resolve_coref(tokens: Tokens, spec: CorefSpec, where: str) -> CorefItem:
    """Token positions of the example's words.

    Raises:
        TokenNotFoundError: a word is missing, or the pronoun occurs more than once.
    """

    def find(word_spec: str, role: str) -> tuple[int, ...]:
        word, occurrence = parse_target(word_spec)
        matches = word_occurrences(tokens, word)
        if not matches:
            raise TokenNotFoundError(
                f"{where}: the {role} {word!r} is not in {tokens.text!r}",
                hint="check the pairs file's words against the sentence",
            )
        if occurrence is None and role == "pronoun" and len(matches) > 1:
            raise TokenNotFoundError(
                f"{where}: the pronoun {word!r} occurs {len(matches)} times", hint=f"write {word}:N to pick one"
            )
        if occurrence is not None and occurrence > len(matches):
            raise TokenNotFoundError(f"{where}: {word_spec!r}: {word!r} occurs {len(matches)} times", hint=None)
        return matches[(occurrence or 1) - 1]

    pronoun = find(spec.pronoun, "pronoun")
    candidates = tuple(find(c, "candidate") for c in spec.candidates)
    referent = find(spec.referent, "referent")
    return CorefItem(pronoun, referent, candidates, tokens.special)


def score_batch(
    engine: Engine, batch: Sequence[Prepared], options: ScanOptions
) -> tuple[HeadAccumulator, CorefTally | None]:
    """One padded forward pass over ``batch`` -> its accumulator (and coreference tally).
    With ``options.ablate``: the detectors as without it, a text at a time (ablation's
    memory is estimated per text), and beside them each text's head-ablation effects at
    its query tokens, one sample per token (``ablation.token_effects``)."""
    if options.ablate is not None:
        from ..measures.ablation import token_effects

        plain = replace(options, ablate=None, fill=None)
        acc = HeadAccumulator.empty(options.config.detectors, options.layers, engine.shape.num_heads)
        effects = HeadAccumulator.empty(("ablation",), options.layers, engine.shape.num_heads)
        tally: CorefTally | None = None
        for p in batch:
            one_acc, one_tally = score_batch(engine, [p], plain)
            acc = acc.merge(one_acc)
            if one_tally is not None:
                tally = one_tally if tally is None else tally.merge(one_tally)
            one = token_effects(engine, p.tokens, options.layers, options.ablate, options.fill, options.query_rule)
            effects = effects.add(one[:, None], np.ones((one.shape[0], 1), dtype=bool))  # (T, 1, N, H)
        return acc.joined(effects), tally
    import torch

    shape = engine.shape
    size = max(len(p.tokens) for p in batch)
    scorer = BlockScorer(
        [p.features for p in batch],
        size,
        shape.causal,
        options.config,
        len(options.layers),
        shape.num_heads,
        [p.coref for p in batch],
    )
    # Each model layer's slots among options.layers (a layer asked twice fills both).
    slots: dict[int, list[int]] = {}
    for i, layer in enumerate(options.layers):
        slots.setdefault(layer, []).append(i)

    def take(layer: int, start: int, stop: int, weights: torch.Tensor) -> None:
        rows = weights.to(device="cpu", dtype=torch.float32).numpy()  # (B, H, l, S)
        for i in slots.get(layer, ()):
            scorer.add(i, start, rows)

    tokens = [p.tokens for p in batch]
    measure = measure_named(options.measure)
    if measure.needs_values:
        from ..measures.norms import norm_shares
        from ..nn.rows import feed_blocks

        # The value norms come with whole matrices (the estimate counts them: estimate_scan).
        out = engine.forward_batch(tokens, max_layer=max(options.layers), measure=measure)
        assert out.value_norms is not None  # asked for
        run = shape.layers[: len(out.attentions)]
        for layer, a, n in zip(run, out.attentions, out.value_norms, strict=True):
            if layer in slots:
                feed_blocks(layer, norm_shares(a, n), take)
    else:
        # A block of query rows at a time: the own engine never holds a layer's matrix.
        engine.forward_batch(tokens, max_layer=max(options.layers), blocks=take, layers=options.layers)
    scores, valid = scorer.scores()
    acc = HeadAccumulator.empty(options.config.detectors, options.layers, shape.num_heads).add(scores, valid)
    return acc, scorer.tally(options.layers)


Progress = Callable[[int], None]  # called with the number of texts just scored (or skipped)


class Scan:
    """The scan loop. ``report()`` may be called at any time (after Ctrl-C, say): it covers
    every batch folded in so far, never half of one."""

    def __init__(self, engine: Engine, options: ScanOptions) -> None:
        self.engine, self.options = engine, options
        empty = HeadAccumulator.empty(options.accumulated, options.layers, engine.shape.num_heads)
        # (heads, coref, texts) in one tuple, replaced in one assignment per batch.
        self._state: tuple[HeadAccumulator, CorefTally | None, int] = (empty, None, 0)
        self.skipped = self.truncated = 0
        self.skipped_where: list[str] = []
        self._started = time.perf_counter()
        self._limit = engine.max_positions
        self._truncating: Tokenizer | None = None

    def tokenize(self, item: CorpusText) -> Prepared | None:
        """The text's tokens (truncated if asked), or None when it is too long and skipped."""
        tokens = item.tokens
        if tokens is None:
            tokens = tokenize(self.engine.tokenizer, item.text)
        if self._limit is not None and len(tokens) > self._limit:
            if not self.options.truncate or item.tokens is not None or item.coref is not None:
                self.skipped += 1
                if len(self.skipped_where) < 5:
                    self.skipped_where.append(item.where)
                return None
            tokens = tokenize(self._truncator(), item.text)
            self.truncated += 1
        coref = resolve_coref(tokens, item.coref, item.where) if item.coref is not None else None
        return prepare(tokens, coref, item.where)

    def _truncator(self) -> Tokenizer:
        if self._truncating is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(self.engine.tokenizer.to_str())
            tok.enable_truncation(max_length=int(self._limit or 0))
            self._truncating = tok
        return self._truncating

    def batches(self, items: Iterable[CorpusText], progress: Progress | None = None) -> Iterator[list[Prepared]]:
        """Tokenized batches; a window of ``window`` batches is sorted by length first."""
        size = self.options.batch_size
        window: list[Prepared] = []
        for item in items:
            prepared = self.tokenize(item)
            if prepared is None:
                if progress is not None:
                    progress(1)
                continue
            window.append(prepared)
            if len(window) >= size * self.options.window:
                for batch in _split(window, size):
                    yield from self.fitting(batch)
                window = []
        if window:
            for batch in _split(window, size):
                yield from self.fitting(batch)

    def fitting(self, batch: list[Prepared]) -> Iterator[list[Prepared]]:
        """``batch``, or its halves (and theirs) where its pass would not fit in memory
        (``options.max_memory``, else the memory free now on the engine's device).

        Raises:
            MemoryBudgetError: one text alone would not fit (before its forward pass).
        """
        if self.options.ablate is not None:  # ablation runs a text at a time: engines.memory.estimate
            yield batch
            return
        from ..engines import memory

        sizes = self.engine.sizes
        length = max(len(p.tokens) for p in batch)
        need = memory.estimate_scan(
            self.engine.shape,
            sizes,
            len(batch),
            length,
            max(self.options.layers) + 1,
            len(self.options.config.detectors),
            norms=measure_named(self.options.measure).needs_values,
        )
        budget = self.options.max_memory
        free, where = memory.available(self.engine.device) if budget is None else (None, "")
        room = budget if budget is not None else free
        if room is None or need.total <= room:
            yield batch
        elif len(batch) > 1:
            half = len(batch) // 2
            yield from self.fitting(batch[:half])
            yield from self.fitting(batch[half:])
        else:
            place = f"{batch[0].where} " if batch[0].where else ""
            memory.check(need, budget, free, where, subject=f"scanning text {place}({length:,} tokens)", scan=True)

    def run(self, items: Iterable[CorpusText], progress: Progress | None = None) -> ScanReport:
        from ..engines import cpu_threads_for

        for batch in self.batches(items, progress):
            with cpu_threads_for(self.engine, sum(len(p.tokens) for p in batch)):
                acc, tally = score_batch(self.engine, batch, self.options)
            self.fold(acc, tally, len(batch))
            if progress is not None:
                progress(len(batch))
        return self.report()

    def fold(self, acc: HeadAccumulator, tally: CorefTally | None, texts: int) -> None:
        """Merge one batch's results (one assignment each, so an interrupt never sees half)."""
        heads, coref, done = self._state
        merged = coref if tally is None else tally if coref is None else coref.merge(tally)
        self._state = (heads.merge(acc), merged, done + texts)

    def report(self, partial: bool = False) -> ScanReport:
        heads, coref, texts = self._state
        return ScanReport(
            heads=heads,
            coref=coref,
            texts=texts,
            skipped=self.skipped,
            skipped_where=tuple(self.skipped_where),
            truncated=self.truncated,
            seconds=time.perf_counter() - self._started,
            partial=partial,
        )


def _split(window: list[Prepared], size: int) -> Iterator[list[Prepared]]:
    ordered = sorted(window, key=lambda p: len(p.tokens))
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


def mark_partial(report: ScanReport) -> ScanReport:
    return replace(report, partial=True)
