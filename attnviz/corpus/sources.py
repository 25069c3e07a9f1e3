"""Corpora for ``attnviz heads``, read streaming: each source yields ``CorpusText`` one
at a time; nothing is slurped.

    text file     one text per line; blank lines are skipped
    JSONL         one JSON object per line with a string ``text`` field
    stdin         either of the above on standard input (``-``)
    probe         ``induction_probe``: random token sequences repeated twice
    pairs         coreference examples (``read_coref``): a minimal-pairs TSV or JSONL of
                  text + pronoun + referent + candidates

A bad corpus stops with a ``UsageError`` naming the file and line: a NUL byte (binary
data), invalid UTF-8, a JSONL line that is not an object with a string ``text``, a file
with no texts. Texts longer than the model's positions are skipped and counted, or
truncated (``ScanOptions.truncate``, in corpus.scan).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..errors import UsageError
from ..tokens import Tokens

if TYPE_CHECKING:
    from tokenizers import Tokenizer


FORMATS = ("auto", "text", "jsonl")
PROBES = ("induction", "retrieval")  # retrieval: corpus/needles.py, its own loop
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
        if sys.stdin is None:  # `<&-`: Python starts without a sys.stdin
            raise UsageError("standard input is closed", hint="pipe the corpus in, or give a file")
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
    from ..io.jsonread import loads

    record = loads(line, f"{name}:{number}:", hint="one JSON object per line")  # bounded: depth, numbers
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
    """Coreference examples from a minimal-pairs TSV (``attnviz.measures.pairs``: sentence A's
    referent is the first target, sentence B's the second, the targets are the candidates)
    or a JSONL file of ``{"text", "pronoun", "referent", "candidates"}``.

    Raises:
        UsageError: as ``read_corpus``, or a record without its fields.
    """
    if Path(source).suffix.lower() not in (*_JSONL_SUFFIXES, ".json"):
        from ..measures.pairs import read_pairs

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
