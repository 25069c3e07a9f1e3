"""Every head scored over a corpus or a probe from Python: ``scan`` (heads --json) and
``retrieval`` (heads --probe retrieval --json).

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import Reason, UsageError
from .common import _load

if TYPE_CHECKING:
    import numpy as np

    from ..corpus.scan import ScanOptions, ScanReport
    from ..corpus.sources import CorpusText
    from ..engines import Engine
    from ..measures.retrieval import RetrievalReport
    from ..result import Provenance
    from ..select import LayerSpec

Progress = Callable[[int, int], None]


# --- the corpus scan ----------------------------------------------------------------


@dataclass(frozen=True)
class HeadScan:
    """Every head scored over a corpus (``attnviz heads``).

    Shape legend: D detectors, N layers, H heads.

    Attributes:
        report: the scan's ``corpus.scan.ScanReport`` (coverage, coreference).
        provenance: the model and engine; measure: what the detectors read.
    """

    report: ScanReport
    provenance: Provenance
    measure: str = "weight"

    @property
    def detectors(self) -> tuple[str, ...]:
        return tuple(self.report.heads.detectors)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(self.report.heads.layers)

    @property
    def mean(self) -> np.ndarray:
        """(D, N, H) each detector's mean score per head (``detectors``, ``layers``)."""
        return self.report.heads.mean

    @property
    def sd(self) -> np.ndarray:
        """(D, N, H) the standard deviation over texts."""
        return self.report.heads.sd

    def scores(self, detector: str) -> np.ndarray:
        """(N, H) one detector's mean per head."""
        if detector not in self.detectors:
            raise UsageError(f"no detector {detector!r} in this scan (it has: {', '.join(self.detectors)})")
        return self.mean[self.detectors.index(detector)]

    def records(self) -> list[dict[str, Any]]:
        """One dict per (layer, head, detector): mean, sd, n (``pandas.DataFrame`` rows)."""
        return [row.to_dict() for row in self.report.heads.rows()]

    def to_dict(self) -> dict[str, Any]:
        """The document of ``attnviz heads --json`` (JSON-ready: rounded, lists)."""
        from ..corpus.scan import report_dict
        from ..result import jsonable

        return jsonable(report_dict(self.report, self.provenance, self.measure))


def scan(
    corpus: str | os.PathLike[str] | Iterable[str] | None = None,
    *,
    probe: str | None = None,
    probe_texts: int = 200,
    probe_length: int = 20,
    seed: int = 0,
    pairs: str | os.PathLike[str] | None = None,
    fmt: str = "auto",
    model: str | None = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    dtype: str = "float32",
    batch_size: int = 16,
    truncate: bool = False,
    local_k: int = 2,
    measure: str = "weight",
    ablate: str | None = None,
    query_rule: str = "all",
    max_memory: int | str | None = None,
    progress: Callable[[int], None] | None = None,
) -> HeadScan:
    """Score every head over a corpus: the previous-token, induction, sink and other
    detectors (``ablate="zero"``/``"mean"``: each head's ablation effect instead).

    ``corpus``: a file (one text a line, or JSONL with a "text" field) or a list of
    texts; or ``probe="induction"`` (``probe_texts`` random sequences of
    ``probe_length`` tokens, repeated); ``pairs``: coreference examples (a minimal-pairs
    TSV or JSONL). ``progress(n)`` is called after each batch with the texts done.

        >>> s = attnviz.scan(probe="induction", probe_texts=20)
        >>> s.scores("induction").shape       # (layers, heads)
        (6, 12)

    ``s.to_dict()`` is ``attnviz heads --probe induction --probe-texts 20 --json``.
    """
    from ..corpus.detectors import DetectorConfig
    from ..corpus.scan import Scan, ScanOptions
    from ..corpus.sources import PROBES, corpus_format
    from ..engines import engine_provenance
    from ..select import parse_layers

    texts: list[str] | None = None
    path: str | None = None
    if isinstance(corpus, (str, os.PathLike)):
        path = os.fspath(corpus)
        corpus_format(path, fmt)
    elif corpus is not None:
        texts = list(corpus)
        if not all(isinstance(t, str) for t in texts):
            raise UsageError("scan(): corpus must be a path or a list of str", reason=Reason.TYPE)
    if corpus is None and probe is None and pairs is None:
        raise UsageError("no texts to scan: give a corpus, a probe or coreference pairs", reason=Reason.EMPTY)
    if corpus is not None and probe is not None:
        raise UsageError("give a corpus or a probe, not both")
    if probe is not None and probe not in PROBES:
        raise UsageError(f"unknown probe {probe!r} (known: {', '.join(PROBES)})")
    if probe == "retrieval":
        raise UsageError("the retrieval probe generates: it is attnviz.retrieval(), not scan()", hint=None)
    eng, budget = _load(None, model, engine, device, dtype, max_memory)
    options = ScanOptions(
        layers=parse_layers("all" if layers is None else layers, eng.num_layers, eng.shape.attention_layers),
        batch_size=batch_size,
        truncate=truncate,
        config=DetectorConfig(local_k=local_k),
        measure=measure,
        ablate=ablate,
        query_rule=query_rule,
        max_memory=budget,
    )
    if texts is not None:
        from ..corpus.sources import CorpusText

        items: Iterator[CorpusText] = iter([CorpusText(text, f"text {n}") for n, text in enumerate(texts, 1)])
    else:
        items, _ = corpus_texts(eng, path, fmt, probe, probe_texts, probe_length, seed, pairs)
    if ablate == "mean":
        items, options = corpus_means(eng, items, options)
    runner = Scan(eng, options)
    report = runner.run(items, progress or (lambda n: None))
    return HeadScan(report, engine_provenance(eng), measure)


def retrieval(
    model: str | None = None,
    *,
    lengths: Sequence[int] = (1024, 4096),
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    needle_length: int = 8,
    seed: int = 0,
    needle_file: str | os.PathLike[str] | None = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    dtype: str = "float32",
    progress: Callable[[int], None] | None = None,
) -> RetrievalReport:
    """Retrieval heads (Wu et al. 2024), as ``attnviz heads --probe retrieval``: each head's
    retrieval score over needle-in-a-haystack prompts of ``lengths`` tokens with the needle
    at ``depths`` (corpus/needles.py, measures/retrieval.py). ``progress(n)`` after each case.

        >>> r = attnviz.retrieval("samples/circuits-2l", lengths=[24, 40], depths=[0, 1],
        ...                       needle_file="samples/needle_ioi.json")
        >>> r.scores.shape                     # (lengths, depths, layers, heads)
        (2, 2, 2, 4)

    ``r.to_dict()`` is the command's ``--json`` without its provenance.
    """
    from pathlib import Path

    from ..corpus.needles import NeedleSpec, check_model, run_probe, within_positions
    from ..engines import load_engine
    from ..io.models import resolve
    from ..select import parse_layers

    file = None if needle_file is None else Path(needle_file)
    if file is not None and not file.is_file():
        raise UsageError(f"retrieval(): needle_file {str(file)!r} is not a file", hint="check the path")
    spec = NeedleSpec(tuple(int(n) for n in lengths), tuple(float(d) for d in depths), needle_length, seed, file)
    within_positions(spec, resolve(model).config)
    eng = load_engine(engine, model, device, dtype)
    check_model(eng, spec)
    chosen = tuple(parse_layers(layers, eng.num_layers, eng.shape.attention_layers))
    return run_probe(eng, spec, chosen, progress)


def corpus_texts(
    eng: Engine,
    corpus: str | None,
    fmt: str,
    probe: str | None,
    probe_texts: int,
    probe_length: int,
    seed: int,
    pairs: str | os.PathLike[str] | None,
) -> tuple[Iterator[CorpusText], int | None]:
    """The texts to scan, lazily, and how many there are when that is cheap to know."""
    from ..corpus.sources import count_lines, induction_probe, read_coref, read_corpus

    sources: list[Iterator[CorpusText]] = []
    total: int | None = 0
    if corpus is not None:
        sources.append(read_corpus(corpus, fmt))
        total = count_lines(corpus)
    elif probe is not None:
        limit = eng.max_positions
        specials = len(eng.tokenize("a")) - 1
        if limit is not None and 2 * probe_length + specials > limit:
            raise UsageError(
                f"the probe's texts ({2 * probe_length} tokens + {specials} special) exceed this model's "
                f"{limit} positions",
                hint=f"use a probe length of {(limit - specials) // 2} or less",
                reason=Reason.PROBE_LENGTH,
                longest=(limit - specials) // 2,
            )
        sources.append(induction_probe(eng.tokenizer, probe_texts, probe_length, seed))
        total = probe_texts
    if pairs is not None:
        sources.append(read_coref(os.fspath(pairs)))
        total = None if corpus is None and probe is None else total
    return itertools.chain(*sources), total or None


def corpus_means(eng: Engine, items: Iterator[CorpusText], options: ScanOptions) -> tuple[Iterator[CorpusText], Any]:
    """Mean-ablation over a corpus: each head's mean output over all its tokens, from one
    unablated pass a text first (the texts are held for the second reading)."""
    from ..measures.ablation import corpus_head_means
    from ..tokens import tokenize

    held = list(items)
    limit = eng.max_positions
    tokens = [item.tokens or tokenize(eng.tokenizer, item.text) for item in held]
    usable = [t for t in tokens if limit is None or len(t) <= limit]
    return iter(held), replace(options, fill=corpus_head_means(eng, usable))
