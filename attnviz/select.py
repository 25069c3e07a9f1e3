"""What to look at: query tokens, layers and target words, checked before any model work
and found in a tokenized sentence (``pipeline.Selection`` holds them; ``pipeline.plan``
resolves it with these functions).

Used by the Python API and by the CLI alike, so each rule lives here once. Messages
carry facts (the word, its occurrences, the tokens, the limit) and name no command-line
flag: the CLI adds those. Stdlib only.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import LayerError, Reason, TokenNotFoundError, UsageError
from .measures.base import MEASURES as _MEASURES
from .measures.base import measure_named
from .shape import layer_list
from .tokens import Tokens, check_index, find_word, word_occurrences

LayerSpec = str | int | Sequence[int] | None

# The attention an encoder-decoder has: encoder self-attention (source -> source),
# decoder self-attention (target -> target, causal) and cross-attention (target -> source).
PARTS = ("encoder", "decoder", "cross")
# What a row shows: the names of the measures (attnviz.measures.base: the objects).
MEASURES = tuple(_MEASURES)


def check_measure(measure: str) -> str:
    """``measure`` if it is one of MEASURES.

    Raises:
        MeasureError: any other name (facts: reason "unknown_measure").
    """
    return measure_named(measure).name


# A layer spec longer than this is not a list of layers anyone typed.
_MAX_LAYER_SPEC = 10_000


@dataclass(frozen=True)
class Query:
    """One query token: a word found in the text (``occurrence``: 1-based, for a repeated
    word), or a raw token position ``index`` (negative counts from the end).

    Raises (on construction):
        UsageError: both or neither of word and index, an occurrence without a word, or
            an occurrence below 1. facts: ``reason``.
    """

    word: str | None = None
    occurrence: int | None = None
    index: int | None = None

    def __post_init__(self) -> None:
        # Every caller (inspect, ablate, explain, patch, attribute) builds its query here:
        # index=1.5 was taken as a position by numpy's indexing or failed deep inside it,
        # and index=True read as 1 (issue 38). numpy's integers are whole numbers too.
        for name in ("index", "occurrence"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise UsageError(
                    f"the query's {name} must be a whole number, not {type(value).__name__} {value!r:.40}",
                    hint=f"give {name}= an int such as 3",
                    reason=Reason.TYPE,
                )
            object.__setattr__(self, name, int(value))
        if self.word is not None and self.index is not None:
            raise UsageError("a query is a word or a token index, not both", reason=Reason.WORD_AND_INDEX)
        if self.word is None and self.index is None:
            raise UsageError("no query token given", reason=Reason.NO_QUERY)
        if self.occurrence is not None:
            if self.index is not None:
                raise UsageError(
                    "an occurrence picks among a word's repeats, not a token index", reason=Reason.OCC_INDEX
                )
            if self.occurrence < 1:
                raise UsageError(f"occurrences count from 1, got {self.occurrence}", reason=Reason.OCC_RANGE)
        if self.word is not None and not self.word.strip():
            raise UsageError("the query word is empty", reason=Reason.EMPTY_WORD)

    @classmethod
    def maybe(cls, word: str | None = None, occurrence: int | None = None, index: int | None = None) -> Query | None:
        """A Query, or None when neither a word nor an index is given (the checks still run)."""
        if word is None and index is None:
            if occurrence is not None:
                raise UsageError("an occurrence needs a word to count", reason=Reason.OCC_WITHOUT_WORD)
            return None
        return cls(word, occurrence, index)

    def resolve(self, tokens: Tokens, where: str | None = None) -> tuple[int, ...]:
        """The token positions this query covers (a word split into pieces gives them all).

        Raises:
            TokenNotFoundError: see ``tokens.find_word`` and ``tokens.check_index``.
        """
        if self.word is not None:
            return find_word(tokens, self.word, self.occurrence, where=where)
        assert self.index is not None  # __post_init__ guarantees one of the two
        return (check_index(tokens, self.index),)


def parse_target(spec: str) -> tuple[str, int | None]:
    """'street' -> ('street', None); 'the:2' -> ('the', 2)."""
    m = re.fullmatch(r"(.+?):(\d+)", spec.strip())
    if m is None:
        return spec.strip(), None
    if int(m[2]) < 1:
        raise UsageError(f"target {spec!r}: occurrences count from 1", reason=Reason.TARGET_OCCURRENCE)
    return m[1], int(m[2])


def find_targets(tokens: Tokens, words: Sequence[str], where: str | None = None) -> dict[str, tuple[int, ...]]:
    """Token positions of each target word, keyed by the word as given.

    ``word`` covers every occurrence (their pieces together); ``word:N`` only the N-th
    (1-based). Matching is ``tokens.word_occurrences``: on the text, case-insensitive.

    Raises:
        TokenNotFoundError: a word is not in the sentence, or N is out of range; the
            message names ``where`` and lists the sentence's tokens. facts: reason "target".
    """
    from .io.safeio import text_noun

    where = where or text_noun(tokens.text)
    out: dict[str, tuple[int, ...]] = {}
    for spec in words:
        word, occurrence = parse_target(spec)
        matches = word_occurrences(tokens, word)
        if not matches:
            raise TokenNotFoundError(
                f"target {word!r} is not in {where}; its tokens are: {tokens.describe()}", reason=Reason.TARGET, count=0
            )
        if occurrence is not None:
            if occurrence > len(matches):
                times = "once" if len(matches) == 1 else f"{len(matches)} times"
                raise TokenNotFoundError(
                    f"target {spec!r} is out of range: {word!r} occurs {times} in {where}",
                    hint=f"use {word}:1..{len(matches)}, or {word} for all occurrences",
                    reason=Reason.TARGET,
                    count=len(matches),
                )
            matches = [matches[occurrence - 1]]
        out[spec] = tuple(sorted({i for m in matches for i in m}))
    return out


def parse_layers(spec: LayerSpec, num_layers: int, attention_layers: Sequence[int] = ()) -> tuple[int, ...]:
    """'all' / None -> every layer; 'N', 'N,M', 'A-B' (inclusive), or ints -> those,
    0-based, negative counting from the end, in the order given, without repeats.

    ``attention_layers``: a hybrid's layers with softmax attention (``ModelShape``), by
    their model numbers; () = every layer. Then 'all' and a range mean the attention
    layers among them, and a single layer without attention is refused, naming those
    that have it.

    Ranges are checked by their ends, never expanded first: '0-200000000' is refused
    at once, and the result never holds more than ``num_layers`` entries.

    Raises:
        LayerError: a layer out of range or without attention, a reversed range, a range
            with no attention layer in it, or a spec we cannot read. facts: ``num_layers``.
    """
    attention = tuple(attention_layers)
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("all", "")):
        return attention or tuple(range(num_layers))
    if isinstance(spec, str) and len(spec) > _MAX_LAYER_SPEC:
        raise LayerError(f"the layer list is {len(spec)} characters long", num_layers=num_layers)
    parts: Sequence[object] = [spec] if isinstance(spec, int) else spec.split(",") if isinstance(spec, str) else spec
    if not parts:  # [] is no layer, not every layer (None is every layer)
        raise LayerError(
            "no layer asked for: the layer list is empty",
            hint="give layer numbers, or None for every layer",
            num_layers=num_layers,
        )

    def check(layer: int) -> int:
        if not -num_layers <= layer < num_layers:
            raise LayerError(
                f"layer {layer} is out of range: this model has {num_layers} layers (0..{num_layers - 1})",
                num_layers=num_layers,
            )
        return layer % num_layers

    def number(text: str) -> int:
        # 18 digits bound int() (Python refuses over 4300 digits) and are out of any range.
        if len(text.lstrip("-")) > 18:
            raise LayerError(
                f"layer {text[:20]}… is out of range: this model has {num_layers} layers (0..{num_layers - 1})",
                num_layers=num_layers,
            )
        return int(text)

    def no_attention(what: str) -> LayerError:
        return LayerError(
            f"{what} no softmax attention: only layers {layer_list(attention)} of this hybrid model have "
            "attention weights (the others are linear-attention, state-space or convolution layers)",
            hint=f"pick one of layers {layer_list(attention)}",
            num_layers=num_layers,
        )

    out: dict[int, None] = {}  # ordered set
    for part in parts:
        text = str(part).strip()
        span = re.fullmatch(r"(-?\d+)\s*-\s*(-?\d+)", text)
        if span:
            first, last = check(number(span[1])), check(number(span[2]))
            if first > last:
                raise LayerError(
                    f"layer range {text!r} runs backwards ({first} > {last})",
                    hint=f"write it low to high: {last}-{first}",
                    num_layers=num_layers,
                )
            if attention:
                inside = [layer for layer in attention if first <= layer <= last]
                if not inside:
                    raise no_attention(f"layers {first}-{last} have")
                out.update(dict.fromkeys(inside))
            else:
                out.update(dict.fromkeys(range(first, last + 1)))
        elif re.fullmatch(r"-?\d+", text):
            layer = check(number(text))
            if attention and layer not in attention:
                raise no_attention(f"layer {layer} has")
            out[layer] = None
        else:
            raise LayerError(f"cannot read layer {text!r}", num_layers=num_layers)
    return tuple(out)
