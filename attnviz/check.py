"""``attnviz check``: proof that our multi-head attention is exact on a given model.

Both engines run the same tokens; for every layer we report the largest absolute
difference between our per-head weights and transformers' (eager attention), and
the largest difference of the final hidden states. float32 only: that is where the
claim "≤ 1e-5" is made. torch is imported only when a comparison runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .errors import EngineError, UsageError
from .heads import ModelShape
from .models import ModelFiles, resolve

TOLERANCE = 1e-5

# Varied on purpose: a pronoun with a distant antecedent, punctuation and numbers,
# repeated words, a grammatical nonsense sentence.
DEFAULT_SENTENCES: tuple[str, ...] = (
    "The animal didn't cross the street because it was too tired.",
    "In 1969, Apollo 11 landed on the Moon; about 600 million people watched it live.",
    "She gave him the book, and he read the book twice before giving it back.",
    "Colorless green ideas sleep furiously.",
)


@dataclass(frozen=True)
class CheckResult:
    """Largest |ours - transformers'| over all sentences, heads, queries and keys.

    Attributes:
        attention: one entry per layer (layer 0 first).
        hidden: final hidden states (transformers' ``last_hidden_state``).
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

    @property
    def worst(self) -> float:
        return max((*self.attention, self.hidden))

    @property
    def failed_layers(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.attention) if d > self.tolerance)

    @property
    def passed(self) -> bool:
        return self.worst <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "shape"}
        out.update(asdict(self.shape))
        out.update(sentences=list(self.sentences), attention=list(self.attention))
        out.update(worst=self.worst, failed_layers=list(self.failed_layers), passed=self.passed)
        return out


def compare_engines(
    model: str | ModelFiles | None = None,
    sentences: Sequence[str] = DEFAULT_SENTENCES,
    device: str = "auto",
    tolerance: float = TOLERANCE,
) -> CheckResult:
    """Run the own and the hf engine on ``sentences`` and measure the differences.

    Raises:
        UsageError: no sentences; UnsupportedArchitectureError when the own engine does
        not implement the model; EngineError when the engines disagree on shapes;
        the loading errors of ``load_engine``.
    """
    from .engines import load_engine

    texts = tuple(s for s in sentences if s.strip())
    if not texts:
        raise UsageError("no sentences to compare on", reason="no_sentences")
    files = model if isinstance(model, ModelFiles) else resolve(model)
    # Our engine first: an unsupported architecture fails before transformers loads anything.
    own = load_engine("own", files, device)
    hf = load_engine("hf", files, device)
    attention = [0.0] * own.num_layers
    hidden = 0.0
    for text in texts:
        tokens = own.tokenize(text)
        ours, theirs = own.forward(tokens), hf.forward(tokens)
        if len(ours.attentions) != len(theirs.attentions):
            raise EngineError(
                f"the own engine computed {len(ours.attentions)} layers, transformers {len(theirs.attentions)}",
                hint="this checkpoint's config and architecture disagree",
            )
        for layer, (a, b) in enumerate(zip(ours.attentions, theirs.attentions, strict=True)):
            attention[layer] = max(attention[layer], _max_abs_diff(a, b, f"layer {layer} attention"))
        hidden = max(hidden, _max_abs_diff(ours.hidden_states, theirs.hidden_states, "hidden states"))
    return CheckResult(
        model=files.spec,
        model_path=str(files.path),
        model_type=files.model_type,
        device=str(own.device),
        shape=own.shape,
        sentences=texts,
        attention=tuple(attention),
        hidden=hidden,
        tolerance=tolerance,
    )


def _max_abs_diff(a: Any, b: Any, what: str) -> float:
    if tuple(a.shape) != tuple(b.shape):
        raise EngineError(
            f"{what}: the own engine gives shape {tuple(a.shape)}, transformers {tuple(b.shape)}",
            hint="this checkpoint's config and architecture disagree",
        )
    # In float64 on the CPU, so the measurement adds no rounding of its own.
    return float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max())
