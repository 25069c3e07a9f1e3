"""Every analysis from Python, each the library half of a command.

    ablate(...)   what removing each head does at one token       compare --ablate --json
    explain(...)  one head's four steps for one token             explain --json
    scan(...)     every head scored over a corpus or probe        heads --json
    check(...)    our attention against transformers' on a model  check --json

``attnviz.inspect(..., ablate=True)`` (show --ablate --json) is the fifth. Each returns a
dataclass: numpy arrays labelled by the layers and heads they cover, ``records()`` for
``pandas.DataFrame(...)``, and ``to_dict()``, the very document its command prints with
``--json`` (the command calls the same code and only prints it). Bad input raises an
``AttnvizError`` subclass with facts (``attnviz.errors``), checked before any model
loads where it can be.

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .errors import Reason, UsageError

if TYPE_CHECKING:
    import numpy as np

    from .corpus.scan import ScanOptions, ScanReport
    from .corpus.sources import CorpusText
    from .engines import Engine
    from .measures.ablation import Effects
    from .measures.check import CheckResult
    from .measures.explain import Explanation
    from .measures.patchpairs import PairsResult
    from .measures.retrieval import RetrievalReport
    from .measures.versus import Versus
    from .pipeline import Plan
    from .result import Attention, HeadEffects, Provenance
    from .select import LayerSpec, Query

Progress = Callable[[int, int], None]


# --- ablation ---------------------------------------------------------------------


def query_effects(
    eng: Engine,
    planned: Plan,
    att: Attention,
    mode: str,
    max_memory: int | None = None,
    progress: Progress | None = None,
) -> HeadEffects:
    """What removing each head of ``att``'s layers does at each of its queries (a split
    word: the mean over its tokens): ``show --ablate``. Ctrl-C stops it (KeyboardInterrupt)."""
    import numpy as np

    from .engines import cpu_threads_for
    from .measures.ablation import Runner, ablate_text, batch_size
    from .result import HeadEffects

    runner = Runner(eng, planned.tokens, planned.part, planned.target)
    batch = batch_size(eng, len(planned.tokens) + (len(planned.target) if planned.target else 0), max_memory)
    with cpu_threads_for(eng, len(planned.tokens) * batch):
        found = ablate_text(runner, mode, batch, att.layers, progress=progress)
    if found.partial:
        raise KeyboardInterrupt
    slots = range(len(att.queries))
    effect = np.stack([found.effect[:, :, list(att.pieces_of_query(slot))].mean(-1) for slot in slots], axis=-1)
    return HeadEffects(mode, effect)


def plan_effects(
    eng: Engine, planned: Plan, layers: Sequence[int], mode: str, max_memory: int | None, progress: Progress | None
) -> Effects:
    """The effects of removing each head of ``layers`` of the planned part, for its first
    query (``planned.queries[0]``), with the LM numbers where the checkpoint has an LM head
    (``compare --ablate``)."""
    from .engines import cpu_threads_for
    from .measures.ablation import Runner, ablate_text, batch_size
    from .measures.lm import load_lm_head

    runner = Runner(eng, planned.tokens, planned.part, planned.target)
    queries = planned.queries[0] if planned.queries else ()
    lm = load_lm_head(eng, planned.part)
    # A masked LM predicts the query's own token with it masked: a pass over that text.
    lm_query = queries[0] if lm is not None and queries else None
    batch = batch_size(eng, len(planned.tokens) + (len(planned.target) if planned.target else 0), max_memory)
    with cpu_threads_for(eng, len(planned.tokens) * batch):
        if lm is not None and lm.kind == "causal":  # the next token: from the same passes
            return ablate_text(runner, mode, batch, layers, lm=lm, lm_query=lm_query, progress=progress)
        effects = ablate_text(runner, mode, batch, layers, progress=progress)
        if lm is not None and lm_query is not None and not effects.partial:
            effects = lm.effects(runner, effects, mode, batch, layers, lm_query, progress)
    return effects


@dataclass(frozen=True)
class HeadAblation:
    """What removing each head does at one token (``attnviz compare --ablate``).

    Shape legend: N the ablated layers (``layers``), H the heads.

    Attributes:
        tokens: the text's tokens; query: the token positions the effect is averaged over.
        layers: the model layers ablated (``effect[n]`` is layer ``layers[n]``).
        effect: (N, H) 1 − cos of the final hidden state at the query.
        kl, delta_logprob: (N, H) with an LM head (KL(p ‖ p_ablated) in nats, the change
            in log p of ``top_token``), else None.
        effects: the whole ``measures.ablation.Effects`` (every position, the passes).
        provenance: the model and engine.
    """

    tokens: tuple[str, ...]
    query: tuple[int, ...]
    layers: tuple[int, ...]
    effect: np.ndarray
    kl: np.ndarray | None
    delta_logprob: np.ndarray | None
    effects: Effects
    provenance: Provenance

    @property
    def heads(self) -> int:
        return int(self.effect.shape[1])

    def records(self) -> list[dict[str, Any]]:
        """One dict per (layer, head): layer, head, effect, kl, delta_logprob (None where
        there is no number), for ``pandas.DataFrame(result.records())``."""
        from .result import jsonable

        out = []
        for n, layer in enumerate(self.layers):
            for h in range(self.heads):
                row: dict[str, Any] = {"layer": layer, "head": h, "effect": self.effect[n, h]}
                row["kl"] = None if self.kl is None else self.kl[n, h]
                row["delta_logprob"] = None if self.delta_logprob is None else self.delta_logprob[n, h]
                out.append(jsonable(row, None))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The provenance, ``compare --ablate --json``'s "ablation" object, and per head
        its effect, kl and delta_logprob as compare's rows carry them (rounded)."""
        from .result import jsonable, provenance_fields

        out = {**provenance_fields(self.provenance), "tokens": list(self.tokens), "query_indices": list(self.query)}
        out["ablation"] = self.effects.to_dict()
        out["heads"] = self.records()
        return jsonable(out)


def ablate(
    sentence: str,
    token: str | None = None,
    *,
    occurrence: int | None = None,
    index: int | None = None,
    mode: str = "zero",
    model: str | None = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    dtype: str = "float32",
    max_memory: int | str | None = None,
    pair: str | None = None,
    target: str | None = None,
    part: str | None = None,
) -> HeadAblation:
    """Remove each head of ``layers`` (default all) in turn, its output before W^O set to
    zero (``mode="mean"``: its mean over the text's tokens), and measure what that does at
    ``token``: 1 − cos of the final hidden state, and with an LM head the KL divergence and
    the change in log p of the top token. One forward pass per head batch.

        >>> r = attnviz.ablate("The animal didn't cross the street because it was too tired", "it", layers="0-1")
        >>> r.effect.shape                    # (layers, heads)
        (2, 12)

    The same numbers as ``attnviz compare SENTENCE --token it --ablate --json``.
    """
    from .measures.ablation import check_mode
    from .pipeline import Selection, plan

    check_mode(mode)
    query = _query(token, occurrence, index)
    selection = Selection(queries=(query,), layers=layers, part=part)
    eng, budget = _load(sentence, model, engine, device, dtype, max_memory)
    planned = plan(sentence, eng, selection, pair=pair, target=target)
    return ablation_of(eng, planned, mode, budget)


def ablation_of(
    eng: Engine, planned: Plan, mode: str, max_memory: int | None = None, progress: Progress | None = None
) -> HeadAblation:
    """``ablate``'s answer for a planned text (its first query), through ``plan_effects``."""
    from .engines import engine_provenance

    effects = plan_effects(eng, planned, planned.layers, mode, max_memory, progress)
    query = planned.queries[0]
    layers = tuple(planned.layers)
    effect = effects.effect[list(layers)][:, :, list(query)].mean(-1)
    pick = list(layers)
    return HeadAblation(
        tokens=tuple(planned.tokens.labels),
        query=tuple(query),
        layers=layers,
        effect=effect,
        kl=None if effects.kl is None else effects.kl[pick],
        delta_logprob=None if effects.delta_logprob is None else effects.delta_logprob[pick],
        effects=effects,
        provenance=engine_provenance(eng),
    )


# --- explain ------------------------------------------------------------------------


def explain(
    sentence: str,
    token: str | None = None,
    *,
    layer: int,
    head: int,
    key: str | None = None,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "float32",
) -> Explanation:
    """How head ``head`` of layer ``layer`` came to its weights for ``token``: q, k, the
    scores, scale, mask, softmax, value norms, contributions and output (attnviz's own
    attention modules). ``key``: a word (``WORD:N``) whose q ⊙ k dimensions to list.

        >>> x = attnviz.explain("The animal didn't cross the street because it was too tired", "it", layer=3, head=1)
        >>> round(float(x.weights.sum()), 4)  # the softmax's row
        1.0

    ``x.to_dict()`` is ``attnviz explain ... --json``.
    """
    from .select import Query, parse_target

    query = _query(token, occurrence, index)
    key_query = None
    if key is not None:
        word, n = parse_target(key)
        key_query = Query(word, n)
    return explain_text(sentence, query, layer, head, key_query, model, device, dtype)


def explain_text(
    text: str,
    query: Query,
    layer: int,
    head: int,
    key: Query | None = None,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "float32",
) -> Explanation:
    """``explain`` for a query already built (the command line builds it from its flags).
    The layer, head and words are checked from the checkpoint's files before it loads."""
    from .engines import load_engine
    from .measures.explain import explain as run_explain

    files, tokenizer = _explain_precheck(text, model, query, key, layer, head)
    eng = load_engine("own", files, device, dtype, tokenizer=tokenizer)
    tokens = eng.tokenize(text)
    positions = query.resolve(tokens)
    key_at = key.resolve(tokens)[0] if key is not None else None
    found = run_explain(eng, tokens, positions[0], layer, head, key_at)
    return replace(found, query_indices=tuple(positions))


def _explain_precheck(
    text: str, model: str | None, query: Query, key: Query | None, layer: int, head: int
) -> tuple[Any, Any]:
    """The layer, head and words checked from the checkpoint's config and tokenizer: a
    mistake here costs no model load. Returns the files and the tokenizer (the engine's)."""
    from .architectures import family
    from .engines import score_terms
    from .errors import Reason, UnsupportedArchitectureError
    from .io.checkpoint import config_layers
    from .io.models import resolve
    from .io.safeio import check_text
    from .measures.explain import check_family, check_head
    from .tokens import load_tokenizer, tokenize

    check_text(text)
    files = resolve(model)
    config = files.config
    try:
        family(config)
    except UnsupportedArchitectureError as exc:
        raise UsageError(
            f"explain reads attnviz's own attention modules: {exc.message}", reason=Reason.EXPLAIN_FAMILY
        ) from None
    check_family(files.model_type, score_terms(files))
    layers = config_layers(config)
    heads = next(
        (config[n] for n in ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads") if config.get(n)),
        None,
    )
    if isinstance(layers, int) and isinstance(heads, int):
        check_head(layers, heads, layer, head)
    tokenizer = load_tokenizer(files.path)
    tokens = tokenize(tokenizer, text, None)
    query.resolve(tokens)
    if key is not None:
        key.resolve(tokens)
    return files, tokenizer


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
        from .corpus.scan import report_dict
        from .result import jsonable

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
    from .corpus.detectors import DetectorConfig
    from .corpus.scan import Scan, ScanOptions
    from .corpus.sources import PROBES, corpus_format
    from .engines import engine_provenance
    from .select import parse_layers

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
        from .corpus.sources import CorpusText

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

    from .corpus.needles import NeedleSpec, check_model, run_probe, within_positions
    from .engines import load_engine
    from .io.models import resolve
    from .select import parse_layers

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
    from .corpus.sources import count_lines, induction_probe, read_coref, read_corpus

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
    from .measures.ablation import corpus_head_means
    from .tokens import tokenize

    held = list(items)
    limit = eng.max_positions
    tokens = [item.tokens or tokenize(eng.tokenizer, item.text) for item in held]
    usable = [t for t in tokens if limit is None or len(t) <= limit]
    return iter(held), replace(options, fill=corpus_head_means(eng, usable))


# --- check --------------------------------------------------------------------------


def check(
    model: str | None = None,
    sentences: Sequence[str] = (),
    *,
    device: str = "auto",
    parts: Sequence[str] | None = None,
) -> CheckResult:
    """Run attnviz's own attention and transformers' on a few sentences (the defaults,
    then ``sentences``) and return, per layer, the largest difference of the weights;
    ``result.passed`` is False when any exceeds 1e-5.

        >>> attnviz.check().passed
        True

    ``result.to_dict()`` is ``attnviz check --json``.
    """
    from .measures.check import DEFAULT_SENTENCES, compare_engines

    return compare_engines(model, (*DEFAULT_SENTENCES, *sentences), device, parts=parts)


# --- patching over pairs -----------------------------------------------------------


def patch_pairs(
    pairs: str | os.PathLike[str] | Sequence[Any],
    *,
    metric: str | None = None,
    direction: str = "denoise",
    site: str = "z",
    token: str | None = None,
    occurrence: int | None = None,
    index: int | None = None,
    model: str | None = None,
    engine: str = "own",
    layers: LayerSpec = None,
    device: str = "auto",
    dtype: str = "float32",
    max_memory: int | str | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> PairsResult:
    """Patching over many pairs, as ``attnviz patch --pairs FILE``: every pair patched on its
    own, then each head's mean effect with a 95% bootstrap interval over the pairs.

        >>> r = attnviz.patch_pairs("samples/ioi_pairs.jsonl", model="samples/circuits-2l")
        >>> r.mean, r.low, r.high   # (layers, heads) each
        >>> r.ranked(3)             # [(label, mean, low, high, pairs counted), ...]

    ``pairs``: a JSONL or TSV file (docs/patching.md), or a list of dicts with ``clean``,
    ``corrupted`` and optionally ``answer`` and ``wrong`` (or of such tuples).
    ``result.to_dict()`` is the command's ``--json``.
    """
    from .measures.ablation import batch_size
    from .measures.patchpairs import patch_pairs as run
    from .measures.patchpairs import read_patch_pairs
    from .select import Query, parse_layers

    if isinstance(pairs, (str, os.PathLike)):
        given = read_patch_pairs(os.fspath(pairs))
    else:
        given = [_pair(item, i) for i, item in enumerate(pairs)]
        if not given:
            raise UsageError("patch_pairs(): no pairs given", reason=Reason.PATCH_PAIR)
    query = Query.maybe(token, occurrence, index)
    eng, budget = _load(None, model, engine, device, dtype, max_memory)
    chosen = parse_layers(layers, eng.num_layers, eng.shape.layers)
    longest = max(len(eng.tokenize(p.clean)) for p in given) + 2
    return run(eng, given, metric=metric, direction=direction, site=site, query=query, layers=chosen,
               batch=batch_size(eng, longest, budget), resamples=resamples, seed=seed)  # fmt: skip


def _pair(item: Any, i: int) -> Any:
    """A ``PatchPair`` from a dict or a tuple given to ``patch_pairs``."""
    from .measures.patchpairs import COLUMNS, PatchPair

    fields = dict(zip(COLUMNS, item, strict=False)) if isinstance(item, (tuple, list)) else item
    if (
        not isinstance(fields, dict)
        or not isinstance(fields.get("clean"), str)
        or not isinstance(fields.get("corrupted"), str)
    ):
        raise UsageError(
            f"patch_pairs(): pair {i} is not a dict (or tuple) with clean and corrupted texts", reason=Reason.TYPE
        )
    return PatchPair(fields["clean"], fields["corrupted"], fields.get("answer"), fields.get("wrong"), f"pair {i}")


# --- two checkpoints head by head ---------------------------------------------------


def versus(
    pairs: Sequence[Any],
    model_a: Engine,
    model_b: Engine,
    *,
    metric: str | None = None,
    direction: str = "denoise",
    query: Query | None = None,
    batch: int | None = None,
    progress: Progress | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> Versus:
    """Every head's change from ``model_a`` to ``model_b`` (``measures.versus``) on each
    ``PatchPair`` (corrupted "" : no patching), at each pair's scored token: ``patch
    --vs-model``. Ctrl-C keeps the pairs done (``partial``)."""
    from .measures.base import NORM, WEIGHT
    from .measures.versus import QUANTITIES, check_same_shape, summarise

    check_same_shape(model_a.shape, model_b.shape, model_a.files.spec, model_b.files.spec)
    patching = all(p.corrupted for p in pairs)
    changes: dict[str, list[np.ndarray]] = {q: [] for q in QUANTITIES}
    notes: list[str] = []
    names = ("", "")
    partial = False
    try:
        for i, pair in enumerate(pairs):
            a = _versus_reads(model_a, pair, metric, direction, query, batch, patching, notes)
            b = _versus_reads(model_b, pair, metric, direction, query, batch, patching, notes)
            if a["ids"] != b["ids"]:
                raise UsageError(
                    f"{pair.where}: the two models tokenize the clean prompt differently", reason=Reason.VS_MODEL
                )
            for q in ("patching", "ablation"):
                if q in a:
                    changes[q].append(b[q] - a[q])
            for q in (WEIGHT.name, NORM.name):
                if q in a and q in b:
                    changes[q].append(_distance(a[q], b[q]))
            names = (a.get("metric", ""), direction if patching else "")
            if progress is not None:
                progress(i + 1, len(pairs))
    except KeyboardInterrupt:
        partial = True
    result = summarise(model_a.files.spec, model_b.files.spec, model_a.name, changes, names[0], names[1], partial,
                       resamples, seed=seed)  # fmt: skip
    return replace(result, notes=tuple(dict.fromkeys(notes)))


def _distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from .measures.versus import total_variation

    return total_variation(a, b)


def _versus_reads(
    eng: Engine,
    pair: Any,
    metric: str | None,
    direction: str,
    query: Query | None,
    batch: int | None,
    patching: bool,
    notes: list[str],
) -> dict[str, Any]:
    """One model on one pair: its (N, H, S) weight and norm-share rows and (N, H) ablation
    effects at the scored token, and with a corrupted prompt its (N, H) patching effects."""
    from .errors import MeasureError
    from .measures.base import NORM, WEIGHT
    from .measures.patching import patch_heads
    from .measures.patchpairs import prepare_pairs
    from .measures.versus import shares
    from .pipeline import Selection, plan, read
    from .select import Query as Q

    out: dict[str, Any] = {}
    if patching:
        (prepared,), lm = prepare_pairs(eng, [pair], metric, query)
        result = patch_heads(eng, prepared.clean, prepared.corrupted, prepared.metric, position=prepared.position,
                             direction=direction, batch=batch, lm=lm)  # fmt: skip
        if result.partial:
            raise KeyboardInterrupt
        out["patching"], out["metric"], position = result.effect, result.metric, result.position
        tokens = prepared.clean
    else:
        tokens = eng.tokenize(pair.clean)
        if query is not None:
            position = query.resolve(tokens, "the clean text")[-1]
        else:
            plain = [i for i in range(len(tokens)) if not tokens.special[i]] or list(range(len(tokens)))
            position = plain[-1]
    out["ids"] = list(tokens.ids)
    planned = plan(pair.clean, eng, Selection(queries=(Q(index=position),)))
    out[WEIGHT.name] = read(planned, eng).attention.weights[:, :, 0, :].astype(float)
    try:
        normed = plan(pair.clean, eng, Selection(queries=(Q(index=position),), measure=NORM.name))
        out[NORM.name] = shares(read(normed, eng).attention.weights[:, :, 0, :])
    except MeasureError as exc:
        notes.append(f"no norm change: {exc.message}")
    out["ablation"] = ablation_of(eng, planned, "zero").effect
    return out


# --- shared -------------------------------------------------------------------------


def _query(token: str | None, occurrence: int | None, index: int | None) -> Query:
    """One query token from a word (``WORD:N`` picks the N-th), occurrence or index."""
    from .select import Query, parse_target

    if isinstance(token, str) and occurrence is None and index is None:
        word, n = parse_target(token)
        if n is not None and word.strip():
            return Query(word, n)
    query = Query.maybe(token, occurrence, index)
    if query is None:
        raise UsageError("say which token: a word, or an index", reason=Reason.NO_QUERY)
    return query


def _load(
    text: str | None, model: str | None, engine: str, device: str, dtype: str, max_memory: int | str | None
) -> tuple[Engine, int | None]:
    """The text checked, the memory budget read, then the engine loaded."""
    from .engines import load_engine
    from .engines.memory import parse_size
    from .io.safeio import check_text

    if text is not None:
        check_text(text)
    budget = parse_size(max_memory) if isinstance(max_memory, str) else max_memory
    return load_engine(engine, None if model is None else os.fspath(model), device, dtype), budget


__all__ = ["HeadAblation", "HeadScan", "ablate", "check", "explain", "patch_pairs", "scan"]
