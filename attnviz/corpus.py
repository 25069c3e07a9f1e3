"""Corpora for ``attnviz heads``: reading them streaming, batching, and the scan loop.

Sources (each yields ``CorpusText`` one at a time; nothing is slurped):

    text file     one text per line; blank lines are skipped
    JSONL         one JSON object per line with a string ``text`` field
    stdin         either of the above on standard input (``-``)
    probe         ``induction_probe``: random token sequences repeated twice
    pairs         coreference examples (``read_coref``): a minimal-pairs TSV or JSONL of
                  text + pronoun + referent + candidates

A bad corpus stops with a ``UsageError`` naming the file and line: a NUL byte (binary
data), invalid UTF-8, a JSONL line that is not an object with a string ``text``, a file
with no texts. Texts longer than the model's positions are skipped and counted, or
truncated (``ScanOptions.truncate``).

The scan keeps only the per-head accumulators and a window of a few batches (sorted by
length so that batches pad little): memory is flat in the corpus size.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from .detectors import (
    CorefItem,
    CorefTally,
    DetectorConfig,
    HeadAccumulator,
    HeadScore,
    TextFeatures,
    features,
    text_scores,
)
from .errors import TokenNotFoundError, UsageError
from .result import Provenance
from .select import parse_target
from .tokens import Tokens, tokenize, word_occurrences

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from .engines import Engine

FORMATS = ("auto", "text", "jsonl")
PROBES = ("induction",)
_JSONL_SUFFIXES = (".jsonl", ".ndjson")
MAX_LINE_BYTES = 1 << 20  # far beyond any model's positions; bounds the memory one line can take


@dataclass(frozen=True)
class CorefSpec:
    """Words of one coreference example, found in the text once it is tokenized.
    ``word:N`` picks the N-th occurrence, as compare's targets do."""

    pronoun: str
    referent: str
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class CorpusText:
    """One text of a corpus. ``where`` is ``file:line`` (or ``probe #n``) for messages;
    ``tokens`` is set when the source is already tokenized (the probe)."""

    text: str
    where: str
    tokens: Tokens | None = None
    coref: CorefSpec | None = None


# --- reading -------------------------------------------------------------------------


def corpus_format(source: str, fmt: str = "auto") -> str:
    """'text' or 'jsonl': as given, or from the file's suffix (.jsonl/.ndjson)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown corpus format {fmt!r}", hint="use " + ", ".join(FORMATS))
    if fmt != "auto":
        return fmt
    return "jsonl" if Path(source).suffix.lower() in _JSONL_SUFFIXES else "text"


def _open(source: str) -> tuple[IO[bytes], str, bool]:
    if source == "-":
        return sys.stdin.buffer, "<stdin>", False
    shown = repr(source[:80]) + ("…" if len(source) > 80 else "")
    try:
        # open() says it all: missing, a directory, no permission, a name too long (a
        # stat() first raised ENAMETOOLONG unchecked) or holding a NUL byte.
        return Path(source).open("rb"), source, True
    except IsADirectoryError:
        raise UsageError(f"corpus {shown} is a directory", hint="give a text or JSONL file") from None
    except OSError as exc:
        raise UsageError(f"cannot read corpus {shown}: {exc.strerror}", hint="check the path") from None
    except ValueError:  # a NUL byte (possible from Python, never from a shell): no file has that name
        raise UsageError(f"cannot read corpus {shown}: a file name holds no NUL byte", hint="check the path") from None


def _lines(source: str) -> Iterator[tuple[int, str, str]]:
    """(line number, decoded line without its newline, name) of a file or stdin, streaming."""
    handle, name, close = _open(source)
    try:
        number = 0
        # readline with a limit: a file without newlines (a blob) is never read whole.
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise UsageError(
                    f"{name}:{number}: a line longer than {MAX_LINE_BYTES // 2**20} MiB: this is not a corpus of texts",
                    hint="give one text per line",
                )
            nul = raw.find(b"\x00")
            if nul >= 0:
                raise UsageError(
                    f"{name}:{number}: a NUL byte at column {nul + 1}: this looks like a binary file",
                    hint="give a UTF-8 text file, one text per line",
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(
                    f"{name}:{number}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
                    hint="convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8",
                ) from None
            yield number, line.rstrip("\r\n").lstrip("\ufeff") if number == 1 else line.rstrip("\r\n"), name
    finally:
        if close:
            handle.close()


def read_corpus(source: str, fmt: str = "auto") -> Iterator[CorpusText]:
    """The texts of a file (``-`` for stdin), one at a time.

    Raises:
        UsageError: unreadable file, binary data, invalid UTF-8, a bad JSONL line, or no
            texts at all; each with the file name and line number.
    """
    kind = corpus_format(source, fmt)
    seen = 0
    name = "<stdin>" if source == "-" else source
    for number, line, name in _lines(source):
        if not line.strip():
            continue
        if kind == "jsonl":
            record = _json_object(line, name, number)
            if "text" not in record:
                raise UsageError(
                    f"{name}:{number}: no 'text' field (keys: {', '.join(sorted(record)) or 'none'})",
                    hint='each line must be a JSON object like {"text": "..."}',
                )
            text = record["text"]
            if not isinstance(text, str):
                raise UsageError(
                    f"{name}:{number}: 'text' is a {type(text).__name__}, not a string",
                    hint='each line must be a JSON object like {"text": "..."}',
                )
            if not text.strip():
                continue
        else:
            text = line
        seen += 1
        yield CorpusText(text, f"{name}:{number}")
    if not seen:
        raise UsageError(f"corpus {name!r} holds no texts", hint="give a file with one text per line")


def _json_object(line: str, name: str, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{name}:{number}: not JSON: {exc.msg} at column {exc.colno}", hint="one JSON object per line"
        ) from None
    if not isinstance(record, dict):
        raise UsageError(f"{name}:{number}: a JSON {type(record).__name__}, not an object", hint="one object per line")
    return record


def count_lines(source: str) -> int | None:
    """Number of lines of a corpus file (for the progress bar's ETA), read in 1 MiB
    chunks; None for stdin, anything but a regular file (``/dev/zero`` never ends, a FIFO
    would be drained) or an unreadable one."""
    if source == "-":
        return None
    try:
        if not stat.S_ISREG(os.stat(source).st_mode):
            return None
        with open(source, "rb") as handle:
            count, last = 0, b"\n"
            while chunk := handle.read(1 << 20):
                count += chunk.count(b"\n")
                last = chunk[-1:]
            return count + (last != b"\n")
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return None


def read_coref(source: str) -> Iterator[CorpusText]:
    """Coreference examples from a minimal-pairs TSV (``attnviz.pairs``: sentence A's
    referent is the first target, sentence B's the second, the targets are the candidates)
    or a JSONL file of ``{"text", "pronoun", "referent", "candidates"}``.

    Raises:
        UsageError: as ``read_corpus``, or a record without its fields.
    """
    if Path(source).suffix.lower() not in (*_JSONL_SUFFIXES, ".json"):
        from .pairs import read_pairs

        for pair in read_pairs(source):
            where = f"{source}:{pair.line}"
            yield CorpusText(pair.sentence_a, where, coref=CorefSpec(pair.token, pair.targets[0], pair.targets))
            if len(pair.targets) >= 2:
                yield CorpusText(pair.sentence_b, where, coref=CorefSpec(pair.token, pair.targets[1], pair.targets))
        return
    seen = 0
    name = source
    for number, line, name in _lines(source):
        if not line.strip():
            continue
        record = _json_object(line, name, number)
        missing = [k for k in ("text", "pronoun", "referent", "candidates") if k not in record]
        if missing:
            raise UsageError(
                f"{name}:{number}: no {', '.join(repr(k) for k in missing)} field",
                hint='each line needs {"text", "pronoun", "referent", "candidates": [...]}',
            )
        candidates = record["candidates"]
        if not (isinstance(candidates, list) and all(isinstance(c, str) for c in candidates)):
            raise UsageError(f"{name}:{number}: 'candidates' must be a list of words", hint='e.g. ["dog", "cat"]')
        fields_ = [record["text"], record["pronoun"], record["referent"]]
        if not all(isinstance(v, str) and v.strip() for v in fields_):
            raise UsageError(f"{name}:{number}: text, pronoun and referent must be non-empty strings", hint=None)
        words = tuple(candidates) if record["referent"] in candidates else (record["referent"], *candidates)
        seen += 1
        spec = CorefSpec(record["pronoun"], record["referent"], words)
        yield CorpusText(record["text"], f"{name}:{number}", coref=spec)
    if not seen:
        raise UsageError(f"pairs file {name!r} holds no examples", hint="one JSON object per line")


def induction_probe(tokenizer: Tokenizer, count: int = 200, length: int = 20, seed: int = 0) -> Iterator[CorpusText]:
    """``count`` texts of ``length`` random tokens repeated twice, framed by the special
    tokens the tokenizer adds to a sentence ([CLS] ... [SEP], <s> ...): the standard probe
    for induction heads (Olsson et al. 2022). Tokens are drawn uniformly from the
    vocabulary without the special tokens, with numpy's seeded generator."""
    if count < 1 or length < 1:
        raise UsageError(f"the probe needs at least one text of one token (got {count} × {length})", hint=None)
    frame = tokenizer.encode("a")
    first = frame.special_tokens_mask.index(0) if 0 in frame.special_tokens_mask else len(frame.ids)
    last = len(frame.ids) - 1 - frame.special_tokens_mask[::-1].index(0) if 0 in frame.special_tokens_mask else -1
    prefix, suffix = list(frame.ids[:first]), list(frame.ids[last + 1 :])
    specials = {int(i) for i in tokenizer.get_added_tokens_decoder()}
    pool = np.array([i for i in range(tokenizer.get_vocab_size()) if i not in specials and tokenizer.id_to_token(i)])
    rng = np.random.default_rng(seed)
    for n in range(1, count + 1):
        half = [int(i) for i in rng.choice(pool, size=length)]
        ids = prefix + half + half + suffix
        pieces = tuple(tokenizer.id_to_token(i) or "" for i in ids)
        special = tuple([True] * len(prefix) + [False] * (2 * length) + [True] * len(suffix))
        tokens = Tokens(" ".join(pieces), tuple(ids), pieces, ((0, 0),) * len(ids), special)
        yield CorpusText(tokens.text, f"probe #{n}", tokens=tokens)


# --- scanning ------------------------------------------------------------------------


@dataclass(frozen=True)
class ScanOptions:
    """How to scan: which layers, batch size, detectors, and what to do with long texts."""

    layers: tuple[int, ...]
    batch_size: int = 16
    truncate: bool = False
    config: DetectorConfig = field(default_factory=DetectorConfig)
    window: int = 8  # batches held and sorted by length (padding waste vs memory)
    # Head ablation instead of the detectors (heads --ablate): "zero" or "mean"; the
    # queries ("all" real tokens or the "last"); mean-ablation's corpus means (N, H, D).
    ablate: str | None = None
    query_rule: str = "all"
    fill: np.ndarray | None = field(default=None, repr=False)

    @property
    def accumulated(self) -> tuple[str, ...]:
        """What the accumulator holds: the detectors, or ("ablation",)."""
        return ("ablation",) if self.ablate is not None else self.config.detectors

    def __post_init__(self) -> None:
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


def report_dict(report: ScanReport, provenance: Provenance) -> dict[str, Any]:
    """The JSON of ``attnviz heads --json``: provenance, coverage, and every
    (layer, head, detector, mean, sd, n) row; coreference accuracy when there was any."""
    out: dict[str, Any] = {
        "model": provenance.model,
        "engine": provenance.engine,
        "device": provenance.device,
        "dtype": provenance.dtype,
        "layers": list(report.heads.layers),
        "num_heads": report.heads.num_heads,
        "detectors": list(report.heads.detectors),
        "texts": report.texts,
        "skipped": report.skipped,
        "truncated": report.truncated,
        "partial": report.partial,
        "seconds": round(report.seconds, 3),
        "scores": [row.to_dict() for row in report.heads.rows()],
        "provenance": asdict(provenance),
    }
    if report.coref is not None:
        out["coreference"] = {
            "examples": report.coref.total,
            "baseline_nearest": round(report.coref.baseline, 6),
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


def prepare(tokens: Tokens, coref: CorefItem | None = None) -> Prepared:
    return Prepared(tokens, features(tokens.ids, tokens.special, tokens.labels), coref)


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
    With ``options.ablate``: each text's head-ablation effects at its query tokens, one
    sample per token (``ablation.token_effects``)."""
    import torch

    if options.ablate is not None:
        from .ablation import token_effects

        acc = HeadAccumulator.empty(options.accumulated, options.layers, engine.shape.num_heads)
        for p in batch:
            one = token_effects(engine, p.tokens, options.layers, options.ablate, options.fill, options.query_rule)
            acc = acc.add(one[:, None], np.ones((one.shape[0], 1), dtype=bool))  # (T, 1, N, H)
        return acc, None

    out = engine.forward_batch([p.tokens for p in batch], max_layer=max(options.layers))
    weights = [out.attentions[layer].to(device="cpu", dtype=torch.float32).numpy() for layer in options.layers]
    shape = engine.shape
    scores, valid = text_scores(weights, [p.features for p in batch], shape.causal, options.config)
    acc = HeadAccumulator.empty(options.config.detectors, options.layers, shape.num_heads).add(scores, valid)
    tally = None
    if any(p.coref is not None for p in batch):
        tally = CorefTally.empty(options.layers, shape.num_heads)
        for b, p in enumerate(batch):
            if p.coref is not None:
                n = len(p.tokens)
                one = np.stack([w[b, :, :n, :n] for w in weights])  # (N, H, n, n)
                tally = tally.add(one, p.coref)
    return acc, tally


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
        return prepare(tokens, coref)

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
                yield from _split(window, size)
                window = []
        if window:
            yield from _split(window, size)

    def run(self, items: Iterable[CorpusText], progress: Progress | None = None) -> ScanReport:
        from .engines import cpu_threads_for

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
