"""``attnviz check``: proof that our multi-head attention is exact on a given model.

Both engines run the same tokens; for every layer we report the largest absolute
difference between our per-head weights and transformers' (eager attention), and
the largest difference of the final hidden states. float32 only: that is where the
claim "≤ 1e-5" is made. torch is imported only when a comparison runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..errors import EngineError, Reason, UsageError
from ..example import EXAMPLE
from ..io.models import ModelFiles, full_provenance, resolve, shareable_name
from ..shape import ModelShape

if TYPE_CHECKING:
    from ..engines import Engine

TOLERANCE = 1e-5

# Varied on purpose: a pronoun with a distant antecedent, punctuation and numbers,
# repeated words, a grammatical nonsense sentence.
DEFAULT_SENTENCES: tuple[str, ...] = (
    f"{EXAMPLE}.",
    "In 1969, Apollo 11 landed on the Moon; about 600 million people watched it live.",
    "She gave him the book, and he read the book twice before giving it back.",
    "Colorless green ideas sleep furiously.",
)


@dataclass(frozen=True)
class PartCheck:
    """One part of an encoder-decoder: largest |ours - transformers'| per layer of its
    attention, and of the final hidden states of the stack that computes it."""

    part: str  # "encoder", "decoder" or "cross"
    shape: ModelShape
    attention: tuple[float, ...]
    hidden: float

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, **asdict(self.shape), "attention": list(self.attention), "hidden": self.hidden}


@dataclass(frozen=True)
class CheckResult:
    """Largest |ours - transformers'| over all sentences, heads, queries and keys.

    Attributes:
        attention: one entry per layer with softmax attention, in order (layer 0 first;
            a hybrid's are ``shape.layers``, by model number); empty for an
            encoder-decoder, whose differences are in ``parts``.
        hidden: final hidden states (transformers' ``last_hidden_state``); for an
            encoder-decoder the largest over its parts.
        parts: an encoder-decoder's parts (sentence i is the source, sentence i+1 the
            decoder's text); empty for a model with one stack.
    """

    model: str
    model_path: str
    model_type: str
    device: str
    shape: ModelShape
    sentences: tuple[str, ...]
    attention: tuple[float, ...]
    hidden: float
    tolerance: float = TOLERANCE
    parts: tuple[PartCheck, ...] = ()

    @property
    def worst(self) -> float:
        return max((*self.attention, self.hidden, *(d for p in self.parts for d in (*p.attention, p.hidden))))

    @property
    def failed_layers(self) -> tuple[int, ...]:
        """Model layer numbers (a hybrid's attention layers by their true numbers)."""
        return tuple(layer for layer, d in zip(self.shape.layers, self.attention, strict=False) if d > self.tolerance)

    @property
    def failed(self) -> tuple[str, ...]:
        """What is over the tolerance, in words: 'layer 3', 'decoder layer 1', 'cross hidden states'."""
        out = [f"layer {i}" for i in self.failed_layers]
        if not self.parts and self.hidden > self.tolerance:
            out.append("hidden states")
        for p in self.parts:
            out += [f"{p.part} layer {i}" for i, d in enumerate(p.attention) if d > self.tolerance]
            if p.hidden > self.tolerance:
                out.append(f"{p.part} hidden states")
        return tuple(out)

    @property
    def passed(self) -> bool:
        return self.worst <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "shape"}
        out.update(asdict(self.shape))
        out.update(sentences=list(self.sentences), attention=list(self.attention))
        out.update(worst=self.worst, failed_layers=list(self.failed_layers), passed=self.passed)
        if self.parts:
            out.update(parts=[p.to_dict() for p in self.parts])
            out.update(failed=list(self.failed))
        else:
            del out["parts"]
        return out


def compare_engines(
    model: str | ModelFiles | None = None,
    sentences: Sequence[str] = DEFAULT_SENTENCES,
    device: str = "auto",
    tolerance: float = TOLERANCE,
    parts: Sequence[str] | None = None,
) -> CheckResult:
    """Run the own and the hf engine on ``sentences`` and measure the differences.

    An encoder-decoder runs each sentence as the source with the next one (cyclically)
    as the decoder's text, and is measured on ``parts`` (default: all three).

    Raises:
        UsageError: no sentences; UnsupportedArchitectureError when the own engine does
        not implement the model; EngineError when the engines disagree on shapes;
        the loading errors of ``load_engine``.
    """
    from ..engines import load_engine
    from ..io.safeio import check_text

    for n, text in enumerate(sentences, start=1):  # a blank one was dropped silently
        check_text(text, f"sentence {n} ({text!r})" if text else f"sentence {n}")
    texts = tuple(sentences)
    if not texts:
        raise UsageError("no sentences to compare on", reason=Reason.NO_SENTENCES)
    files = model if isinstance(model, ModelFiles) else resolve(model)
    # Our engine first: an unsupported architecture fails before transformers loads anything.
    own = load_engine("own", files, device)
    if parts is not None:
        for part in parts:
            own.part_shape(part)  # an unknown part, or a part of a one-stack model, fails here
    hf = load_engine("hf", files, device)
    if own.parts:
        return _compare_seq2seq(files, own, hf, texts, tolerance, tuple(parts or own.parts))
    attention = [0.0] * len(own.shape.layers)  # a hybrid: its attention layers alone
    hidden = 0.0
    for text in texts:
        tokens = own.tokenize(text)
        ours, theirs = own.forward(tokens), hf.forward(tokens)
        if len(ours.attentions) != len(theirs.attentions):
            raise EngineError(
                f"the own engine computed {len(ours.attentions)} layers, transformers {len(theirs.attentions)}",
                hint="this checkpoint's config and architecture disagree",
            )
        for slot, (a, b) in enumerate(zip(ours.attentions, theirs.attentions, strict=True)):
            layer = own.shape.layers[slot]
            attention[slot] = max(attention[slot], _max_abs_diff(a, b, f"layer {layer} attention"))
        hidden = max(hidden, _max_abs_diff(ours.hidden_states, theirs.hidden_states, "hidden states"))
    return CheckResult(
        model=shareable_name(files.spec),
        model_path=str(files.path) if full_provenance() else shareable_name(files.spec),
        model_type=files.model_type,
        device=str(own.device),
        shape=own.shape,
        sentences=texts,
        attention=tuple(attention),
        hidden=hidden,
        tolerance=tolerance,
    )


def _compare_seq2seq(
    files: ModelFiles, own: Engine, hf: Engine, texts: tuple[str, ...], tolerance: float, parts: tuple[str, ...]
) -> CheckResult:
    shapes = {part: own.part_shape(part) for part in parts}
    attention = {part: [0.0] * shapes[part].num_layers for part in parts}
    hidden = dict.fromkeys(parts, 0.0)
    for source, target in zip(texts, (*texts[1:], texts[0])):
        tokens, target_tokens = own.tokenize(source), own.tokenize_target(target)
        ours, theirs = own.forward_seq2seq(tokens, target_tokens), hf.forward_seq2seq(tokens, target_tokens)
        for part in parts:
            a, b = ours.part(part), theirs.part(part)
            if len(a.attentions) != len(b.attentions):
                raise EngineError(
                    f"{part}: the own engine computed {len(a.attentions)} layers, transformers {len(b.attentions)}",
                    hint="this checkpoint's config and architecture disagree",
                )
            for layer, (x, y) in enumerate(zip(a.attentions, b.attentions, strict=True)):
                attention[part][layer] = max(attention[part][layer], _max_abs_diff(x, y, f"{part} layer {layer}"))
            hidden[part] = max(hidden[part], _max_abs_diff(a.hidden_states, b.hidden_states, f"{part} hidden states"))
    checks = tuple(
        PartCheck(
            part=part,
            shape=shapes[part],
            attention=tuple(attention[part]),
            hidden=hidden[part],
        )
        for part in parts
    )
    return CheckResult(
        model=shareable_name(files.spec),
        model_path=str(files.path) if full_provenance() else shareable_name(files.spec),
        model_type=files.model_type,
        device=str(own.device),
        shape=own.shape,
        sentences=texts,
        attention=(),
        hidden=max(hidden.values()),
        tolerance=tolerance,
        parts=checks,
    )


def _max_abs_diff(a: Any, b: Any, what: str) -> float:
    if tuple(a.shape) != tuple(b.shape):
        raise EngineError(
            f"{what}: the own engine gives shape {tuple(a.shape)}, transformers {tuple(b.shape)}",
            hint="this checkpoint's config and architecture disagree",
        )
    # In float64 on the CPU, so the measurement adds no rounding of its own.
    return float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max())
