"""Tokenization, and finding a word's tokens in a sentence.

Words are found in the *text* and mapped to tokens through the tokenizer's
character offsets, so the same code works for WordPiece (``##ing``), byte-level
BPE (``Ġit``) and SentencePiece (``▁it``) without knowing their marker
conventions. A word split into pieces comes back as all of its pieces.

Uses the ``tokenizers`` library on the checkpoint's ``tokenizer.json``; only a
checkpoint without one falls back to transformers' tokenizer classes.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ModelLoadError, Reason, TokenNotFoundError, UsageError
from .io.safeio import check_text, text_noun

if TYPE_CHECKING:
    from tokenizers import Tokenizer


# How a token the model wrote is labelled in every view (``Tokens.written_start``).
WRITTEN = "«{}»"


@dataclass(frozen=True)
class Tokens:
    """A tokenized sentence.

    Attributes:
        text: the sentence as given.
        ids: token ids, length S.
        pieces: the tokenizer's own token strings (``[CLS]``, ``##al``, ``Ġit``).
        offsets: (start, end) character span of each token in ``text``;
            (0, 0) for special tokens.
        special: True for tokens the tokenizer added ([CLS], [SEP], <s>, ...).
        type_ids: the segment (token type) of each token as the model is fed it: 0 for
            sentence A, 1 for sentence B of a pair; () = all 0 (one sentence).
        pair_start: for a sentence pair, the position of sentence B's first token (the
            boundary the views mark); None for one sentence. The text is then
            ``A + PAIR_SEPARATOR + B``, and B's offsets point into it.
        word_ids: the tokenizer's word (pre-token) of each token, as transformers'
            ``word_ids()`` gives it (None for special tokens); () = not known (a reading
            loaded from a file). Two tokens of different words never join into one word
            (``joins_previous``): BERT makes each CJK character a word of its own.
        written_start: the position of the first token the model wrote (``--generate``):
            tokens from there on were written, not given, and their labels are marked
            «like this» in every view; None = every token was given.
    """

    text: str
    ids: tuple[int, ...]
    pieces: tuple[str, ...]
    offsets: tuple[tuple[int, int], ...]
    special: tuple[bool, ...]
    type_ids: tuple[int, ...] = ()
    pair_start: int | None = None
    word_ids: tuple[int | None, ...] = ()
    written_start: int | None = None

    def __post_init__(self) -> None:
        n = len(self.ids)
        if not (len(self.pieces) == len(self.offsets) == len(self.special) == n):
            raise ValueError(
                f"ids ({n}), pieces ({len(self.pieces)}), offsets ({len(self.offsets)}) "
                f"and special ({len(self.special)}) must have one entry per token"
            )
        if self.type_ids and len(self.type_ids) != n:
            raise ValueError(f"{len(self.type_ids)} token types for {n} tokens")
        if self.word_ids and len(self.word_ids) != n:
            raise ValueError(f"{len(self.word_ids)} word ids for {n} tokens")
        if self.pair_start is not None and not 0 < self.pair_start < n:
            raise ValueError(f"pair_start={self.pair_start} is not inside the {n} tokens")
        if self.written_start is not None and not 0 <= self.written_start <= n:
            raise ValueError(f"written_start={self.written_start} is not inside the {n} tokens")

    def __len__(self) -> int:
        return len(self.ids)

    def written(self, i: int) -> bool:
        """Whether token ``i`` was written by the model (``written_start``), not given."""
        return self.written_start is not None and i >= self.written_start

    @cached_property
    def labels(self) -> tuple[str, ...]:
        """Readable labels: the word text of each token, ``##``-prefixed when it
        continues the previous token inside one word; special tokens as they are; a
        token the model wrote (``written_start``) marked «like this» (``WRITTEN``)."""
        out: list[str] = []
        for i, (piece, (start, end), special) in enumerate(zip(self.pieces, self.offsets, self.special)):
            if special or end <= start:
                label = piece
            else:
                raw = self.text[start:end]
                label = raw.strip() or raw
                label = "##" + label if joins_previous(self, i) else label
            out.append(WRITTEN.format(label) if self.written(i) else label)
        return tuple(out)

    @cached_property
    def segments_unspaced(self) -> bool:
        """Whether the tokenizer's words split runs of a script written without spaces
        (BERT makes each Han character a word): then its ``word_ids`` are the words
        there too; otherwise (byte-level BPE, SentencePiece: a whole run is one word)
        the tokens are."""
        if not self.word_ids:
            return False
        return any(
            self.word_ids[i] is not None
            and self.word_ids[i - 1] is not None
            and self.word_ids[i] != self.word_ids[i - 1]
            and self.offsets[i][0] == self.offsets[i - 1][1] > 0
            and unspaced(self.text[self.offsets[i][0] - 1])
            and unspaced(self.text[self.offsets[i][0]])
            for i in range(1, len(self.ids))
            if self.offsets[i][0] < len(self.text)
        )

    def describe(self, limit: int = 40) -> str:
        """'0:[CLS] 1:the 2:animal ...' for error messages (long sentences are cut)."""
        items = [f"{i}:{label}" for i, label in enumerate(self.labels)]
        if len(items) > limit:
            items = items[: limit - 1] + [f"... ({len(items) - limit + 1} more)"]
        return " ".join(items)


def vocab_label(tokenizer: Tokenizer, index: int) -> str:
    """One vocabulary entry (a predicted token, say) by the labels' rule, whatever the
    tokenizer's kind: the text it decodes to, ``##``-prefixed when it continues a word.
    WordPiece marks a continuation (``##al``); byte-level BPE (``Ġshe``) and SentencePiece
    or Unigram (``▁she``) mark a word start, so an entry without their mark continues one
    (``he`` -> ``##he``). Special tokens, and bytes that decode to no whole character,
    stay the tokenizer's own string (the ablation footer printed ``'Ġshe'``)."""
    piece = tokenizer.id_to_token(index)
    if piece is None:
        return f"<{index}>"
    if piece in {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}:
        return piece
    text = tokenizer.decode([index], skip_special_tokens=False)
    if not text.strip() or "\ufffd" in text:
        return piece
    word = text.strip()
    kind = type(tokenizer.model).__name__
    if kind == "WordPiece":
        return "##" + piece[2:] if piece.startswith("##") else word
    if kind == "WordLevel":  # every entry is a whole word (samples/circuits-2l printed '##Mary')
        return word
    starts = piece.startswith(("Ġ", "▁")) or text[:1].isspace()
    return word if starts else "##" + word


def joins_previous(tokens: Tokens, i: int) -> bool:
    """Whether token ``i`` continues the word of token ``i - 1``: neither is special, it
    starts where that one ends, the characters on both sides of the joint are letters or
    digits ("it." is "it" and "."), and the tokenizer puts both in one word
    (``word_ids``). Between two characters of a script written without spaces (Han,
    kana, Thai...), a tokenizer whose words do not split such runs (byte-level BPE,
    SentencePiece: ``Tokens.segments_unspaced`` is False) has only its pieces for words:
    there each token is a word."""
    if i <= 0:
        return False
    (start, end), (p_start, p_end) = tokens.offsets[i], tokens.offsets[i - 1]
    if tokens.special[i] or tokens.special[i - 1] or end <= start or p_end <= p_start:
        return False
    if start != p_end or start <= 0:
        return False
    before, after = tokens.text[start - 1], tokens.text[start]
    if not (before.isalnum() and after.isalnum()):
        return False
    if tokens.word_ids and tokens.word_ids[i] != tokens.word_ids[i - 1]:
        return False
    return tokens.segments_unspaced or not (unspaced(before) and unspaced(after))


# Scripts written without spaces between words (code point ranges).
_UNSPACED = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x31F0, 0x31FF),  # Katakana extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # half-width Katakana
    (0x20000, 0x3FFFF),  # CJK extensions B and later
)


def unspaced(ch: str) -> bool:
    """``ch`` is a letter of a script written without spaces between words."""
    code = ord(ch)
    return any(low <= code <= high for low, high in _UNSPACED)


def _word_ids(enc: Any) -> tuple[int | None, ...]:
    """One id per (sequence, word) of an encoding, None for special tokens."""
    seen: dict[tuple[int | None, int], int] = {}
    out: list[int | None] = []
    for word, seq in zip(enc.word_ids, enc.sequence_ids):
        out.append(None if word is None else seen.setdefault((seq, word), len(seen)))
    return tuple(out)


# A text file larger than this is refused before it is read whole: 32k tokens of English
# are ~150 KB, and the longest context windows (1M tokens) ~5 MB.
MAX_TEXT_BYTES = 16 * 1024 * 1024


def read_text(source: str | Path, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The text of a UTF-8 file, or of standard input when ``source`` is "-".

    A byte-order mark and one final newline (a file's line ending, not part of the
    text) are dropped; everything else is kept as it is, so character offsets point
    into what the file holds.

    Raises:
        UsageError: the file is missing, unreadable, larger than ``max_bytes``, not
            UTF-8, or holds no text.
    """
    name = "standard input" if str(source) == "-" else str(source)
    try:
        if str(source) == "-":
            if sys.stdin is None:  # `<&-`: Python starts without a sys.stdin
                raise UsageError("standard input is closed", hint="pipe the text in, or give it as an argument")
            data = sys.stdin.buffer.read(max_bytes + 1)
        else:
            with open(source, "rb") as fh:
                data = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise UsageError(f"{name} does not exist", hint="check the path of the text file") from None
    except IsADirectoryError:
        raise UsageError(f"{name} is a directory, not a text file", hint="give the path of a text file") from None
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror or exc}", hint="check the file's permissions") from None
    if len(data) > max_bytes:
        raise UsageError(
            f"{name} is larger than {max_bytes // (1024 * 1024)} MiB",
            hint="give a shorter text (a model reads far less)",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{name} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})",
            hint="convert it, e.g. iconv -t utf-8",
        ) from None
    text = text.removeprefix("\ufeff")
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    if not text.strip():
        raise UsageError(f"{name} holds no text", hint="give a file with the text to inspect")
    return text


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """The checkpoint's fast tokenizer with padding and truncation switched off.

    (all-MiniLM-L6-v2's tokenizer.json pads and truncates to 128 tokens: left on,
    the sentence would grow [PAD]s or silently lose its end.)
    """
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if path.exists():
        from .io.checkpoint import MAX_TOKENIZER_BYTES, check_regular_file

        check_regular_file(path, MAX_TOKENIZER_BYTES)
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise ModelLoadError(
                f"cannot read {path}: {(str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]}",
                hint="the file is corrupt; re-download or re-save the tokenizer",
            ) from exc
    else:
        from .io.checkpoint import require_tokenizer

        require_tokenizer(model_dir)  # never a tokenizer invented with an empty vocabulary
        tokenizer = _tokenizer_from_transformers(model_dir)
    if tokenizer.get_vocab_size(with_added_tokens=True) == 0:
        raise ModelLoadError(
            f"the tokenizer in {model_dir} has an empty vocabulary",
            hint="save the model's own tokenizer beside it with tokenizer.save_pretrained(DIR)",
        )
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _tokenizer_from_transformers(model_dir: Path) -> Tokenizer:
    # Slow path for checkpoints that ship vocab.txt / vocab.json+merges.txt only:
    # transformers converts them to a fast tokenizer.
    try:
        from transformers import AutoTokenizer

        hf: Any = AutoTokenizer.from_pretrained(str(model_dir), use_fast=True)
        backend = hf.backend_tokenizer
    except Exception as exc:
        raise ModelLoadError(
            f"no usable tokenizer in {model_dir}",
            hint="save one with tokenizer.save_pretrained(DIR) so that DIR/tokenizer.json exists",
        ) from exc
    return backend


def tokenize(tokenizer: Tokenizer, sentence: str, max_length: int | None = None) -> Tokens:
    """Encode one sentence, special tokens included.

    Raises:
        UsageError: the sentence is empty, or longer than the model's ``max_length``.
    """
    check_text(sentence)
    if max_length is not None:
        _refuse_long_prefix(tokenizer, sentence, max_length)
    enc = tokenizer.encode(sentence)
    if max_length is not None and len(enc.ids) > max_length:
        raise UsageError(
            f"{text_noun(sentence)} has {len(enc.ids)} tokens; this model reads at most {max_length}",
            hint="shorten the text",
            reason=Reason.TOO_LONG,
            count=len(enc.ids),
            limit=max_length,
        )
    return Tokens(
        text=sentence,
        ids=tuple(enc.ids),
        pieces=tuple(enc.tokens),
        offsets=tuple((int(a), int(b)) for a, b in enc.offsets),
        special=tuple(bool(s) for s in enc.special_tokens_mask),
        word_ids=_word_ids(enc),
    )


def _refuse_long_prefix(tokenizer: Tokenizer, sentence: str, max_length: int) -> None:
    """Refuse a text whose beginning alone has more than ``max_length`` tokens, before
    tokenizing it whole (a 15 MiB text costs 15 s and 3 GB to tokenize; its first 8 KB
    already show it cannot fit 512 positions).

    Prefixes of 16, 32, 64... characters per position are cut at a space: the tokenizers
    split words at spaces, so a prefix ending at a space encodes to a prefix of the
    whole text's tokens (plus the same special tokens), and its count is a lower bound.
    A text without a space in the window is left to the whole encoding.
    """
    window = 16 * max_length
    while window < len(sentence):
        cut = sentence.rfind(" ", 0, window)
        if cut <= 0:
            return
        count = len(tokenizer.encode(sentence[:cut]).ids)
        if count > max_length:
            raise UsageError(
                f"{text_noun(sentence)} has more than {max_length} tokens ({count} in its first {cut:,} characters "
                f"of {len(sentence):,}); this model reads at most {max_length}",
                hint="shorten the text",
                reason=Reason.TOO_LONG,
                count=count,
                limit=max_length,
            )
        window *= 2


def check_ids(tokens: Tokens, vocab_size: int | None, where: str) -> Tokens:
    """Every token id fits the model's embedding table of ``vocab_size`` rows.

    Raises:
        ModelLoadError: an id at or past ``vocab_size`` (a tokenizer from another model):
            torch would fail with an IndexError deep in the embedding lookup.
    """
    if vocab_size is not None and tokens.ids and max(tokens.ids) >= vocab_size:
        i = max(range(len(tokens.ids)), key=tokens.ids.__getitem__)
        raise ModelLoadError(
            f"{where}: the tokenizer gives token {tokens.pieces[i]!r} the id {tokens.ids[i]}, "
            f"but the model's vocabulary has {vocab_size} entries (0..{vocab_size - 1})",
            hint="the tokenizer belongs to another model; save the model's own tokenizer beside it",
        )
    return tokens


# Between the two sentences of a pair in ``Tokens.text``: not a word, so never matched
# as a query or target word, and visible in titles.
PAIR_SEPARATOR = " ‖ "


def tokenize_pair(tokenizer: Tokenizer, first: str, second: str, max_length: int | None = None) -> Tokens:
    """Encode a sentence pair as the model was trained on pairs (BERT's next-sentence and
    entailment inputs, bertviz's ``sentence_b``): the tokenizer's pair template
    ([CLS] A [SEP] B [SEP] for BERT) and its token types, 0 for A and 1 for B.

    Raises:
        UsageError: a sentence is empty, or the pair is longer than ``max_length``.
    """
    if not first.strip() or not second.strip():
        raise UsageError("a sentence of the pair is empty", hint="give two non-empty sentences")
    enc = tokenizer.encode(first, second)
    if max_length is not None and len(enc.ids) > max_length:
        raise UsageError(
            f"the sentence pair has {len(enc.ids)} tokens; this model reads at most {max_length}",
            hint="shorten the sentences",
        )
    shift = len(first) + len(PAIR_SEPARATOR)
    sequence = enc.sequence_ids
    offsets = tuple(
        (int(a) + shift, int(b) + shift) if seq == 1 and b > a else (int(a), int(b))
        for (a, b), seq in zip(enc.offsets, sequence)
    )
    starts = [i for i, seq in enumerate(sequence) if seq == 1]
    if not starts:  # pragma: no cover - every tokenizer with a pair template marks sentence B
        raise UsageError("this tokenizer has no template for sentence pairs", hint="give one sentence")
    return Tokens(
        text=first + PAIR_SEPARATOR + second,
        ids=tuple(enc.ids),
        pieces=tuple(enc.tokens),
        offsets=offsets,
        special=tuple(bool(s) for s in enc.special_tokens_mask),
        type_ids=tuple(int(t) for t in enc.type_ids),
        pair_start=starts[0],
        word_ids=_word_ids(enc),
    )


# Markers tokenizers put on pieces: WordPiece continuation, byte-level BPE space, SentencePiece space.
_PIECE_MARKERS = ("##", "Ġ", "▁")


def is_punctuation(label: str) -> bool:
    """True for a token label made only of Unicode punctuation (categories P*: ``.``,
    ``,``, ``'``, ``«``, ``--``, ``...``, ``%``), once the piece marker and spaces are stripped.

    The one rule of attnviz: compare's and show's ``punct`` exclusion and the heads
    command's punctuation detector (Clark et al. 2019) use it. Symbols are not
    punctuation: ``$``, ``+``, ``=`` (categories S*) carry meaning ("$5", "2 + 2")."""
    text = label.strip()
    if text.startswith("«") and text.endswith("»") and len(text) > 2:
        text = text[1:-1]  # a written token's mark (``WRITTEN``)
    for marker in _PIECE_MARKERS:
        text = text.removeprefix(marker)
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def word_occurrences(tokens: Tokens, word: str) -> list[tuple[int, ...]]:
    """Every occurrence of ``word`` in the sentence, as the token positions covering it.

    Matching is on the text, case-insensitive, on whole words ("it" does not match
    "with"); a word split into several tokens gives all of them. When the text has
    no match, the tokens' own strings are tried (``[SEP]``, ``##al``, ``Ġit``).
    """
    needle = word.strip()
    if not needle:
        return []
    # Every occurrence (overlapping too); each end must be a word's end: past a non-word
    # character, or at a boundary of the tokens' words (``joins_previous``), so that 東京
    # is found in 我在東京工作 where the tokenizer's words are 東 and 京.
    starts, ends = _word_edges(tokens)
    text = tokens.text
    found: list[tuple[int, ...]] = []
    for m in re.finditer(f"(?=({re.escape(needle)}))", text, flags=re.IGNORECASE):
        a, b = m.start(1), m.end(1)
        if re.match(r"\w", needle) and a > 0 and re.match(r"\w", text[a - 1]) and a not in starts:
            continue
        if re.search(r"\w$", needle) and b < len(text) and re.match(r"\w", text[b]) and b not in ends:
            continue
        covering = tuple(
            i
            for i, ((start, end), special) in enumerate(zip(tokens.offsets, tokens.special))
            if not special and end > start and start < b and end > a
        )
        if covering and covering not in found:
            found.append(covering)
    if found:
        return found
    lowered = needle.lower()
    return [
        (i,)
        for i, (piece, label) in enumerate(zip(tokens.pieces, tokens.labels))
        if piece.lower() == lowered or label.lower() == lowered
    ]


def _word_edges(tokens: Tokens) -> tuple[set[int], set[int]]:
    """The character positions where the tokens' words start, and where they end."""
    starts: set[int] = set()
    ends: set[int] = set()
    for i, (start, end) in enumerate(tokens.offsets):
        if tokens.special[i] or end <= start:
            continue
        if not joins_previous(tokens, i):
            starts.add(start)
        if not (i + 1 < len(tokens) and joins_previous(tokens, i + 1)):
            ends.add(end)
    return starts, ends


def find_word(tokens: Tokens, word: str, occurrence: int | None = None, where: str | None = None) -> tuple[int, ...]:
    """The token positions of one occurrence of ``word`` (1-based ``occurrence``).
    ``where`` names the text in messages ("sentence B" for a minimal pair; default
    ``text_noun``: "the sentence", or "the text" for more than one).

    Raises:
        TokenNotFoundError: not in the sentence (facts: reason "missing"), repeated and no
            occurrence given ("ambiguous", count), or the occurrence out of range
            ("occurrence", count). The message lists what is there.
    """
    where = where or text_noun(tokens.text)
    matches = word_occurrences(tokens, word)
    if not matches:
        raise TokenNotFoundError(
            f"{word!r} is not in {where}; its tokens are: {tokens.describe()}", reason=Reason.MISSING, count=0
        )
    positions = ", ".join(_positions(m) for m in matches)
    if occurrence is None:
        if len(matches) > 1:
            raise TokenNotFoundError(
                f"{word!r} occurs {len(matches)} times in {where} (at token {positions})",
                reason=Reason.AMBIGUOUS,
                count=len(matches),
            )
        return matches[0]
    if not 1 <= occurrence <= len(matches):
        times = "once" if len(matches) == 1 else f"{len(matches)} times"
        raise TokenNotFoundError(
            f"occurrence {occurrence} is out of range: {word!r} occurs {times} in {where} (at token {positions})",
            reason=Reason.OCCURRENCE,
            count=len(matches),
        )
    return matches[occurrence - 1]


def check_index(tokens: Tokens, index: int) -> int:
    """Validate a raw token position (negative counts from the end, as in Python)."""
    n = len(tokens)
    if not -n <= index < n:
        raise TokenNotFoundError(
            f"token index {index} is out of range: {text_noun(tokens.text)} has {n} tokens (0..{n - 1}): "
            f"{tokens.describe()}",
            reason=Reason.INDEX,
            count=n,
        )
    return index % n


def _positions(indices: tuple[int, ...]) -> str:
    return str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"
