"""The model's shape, labels for attention heads, and the structure notes views show.
Stdlib only: every layer (engines, provenance, check, renderers) shares these.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """What every view needs to know of a model's attention.

    Attributes:
        num_layers: L, layers with attention.
        num_heads: H, query heads per layer.
        num_kv_heads: G, key/value heads (G < H under grouped-query attention).
        causal: a decoder: token i attends only to tokens 0..i.
        attention_sinks: learned per-head sink logits (GPT-OSS): each row's softmax also
            covers a logit that is no token, so the weights of a row sum to 1 - the
            sink's share (1 - the row's sum; ``Attention.sink_share``).
        attention_layers: a hybrid's model layer numbers (0-based, ascending) of the
            layers with softmax attention, the others being linear attention, Mamba or
            convolution layers with no weights to show; () when every layer has it.
            Layers are always named by these true model numbers, never by their
            position among the attention layers.
    """

    num_layers: int
    num_heads: int
    num_kv_heads: int
    causal: bool
    attention_sinks: bool = False
    attention_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_layers < 1 or self.num_heads < 1 or self.num_kv_heads < 1:
            raise ValueError(f"a model needs at least one layer and head, got {self}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        given = self.attention_layers
        if given and (list(given) != sorted(set(given)) or given[0] < 0 or given[-1] >= self.num_layers):
            raise ValueError(f"attention_layers {given} must ascend within 0..{self.num_layers - 1}")

    @property
    def layers(self) -> tuple[int, ...]:
        """The model layer numbers with softmax attention: every layer, or a hybrid's few."""
        return self.attention_layers or tuple(range(self.num_layers))

    @property
    def hybrid(self) -> bool:
        """Whether some layers have no softmax attention (``attention_layers``)."""
        return bool(self.attention_layers) and len(self.attention_layers) < self.num_layers

    def head_label(self, head: int) -> str:
        return head_label(head, self.num_heads, self.num_kv_heads)

    def notes(self) -> list[str]:
        notes = structure_notes(self.causal, self.num_heads, self.num_kv_heads, self.attention_sinks)
        if self.hybrid:
            notes.append(hybrid_note(self.attention_layers, self.num_layers))
        return notes


class HasShape:
    """``num_layers``, ``num_heads``, ``num_kv_heads`` and ``causal`` read from a ``shape``
    attribute (a ``ModelShape``): the engines and provenance share these four names."""

    shape: ModelShape

    @property
    def num_layers(self) -> int:
        return self.shape.num_layers

    @property
    def num_heads(self) -> int:
        return self.shape.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.shape.num_kv_heads

    @property
    def causal(self) -> bool:
        return self.shape.causal


def kv_group(head: int, num_heads: int, num_kv_heads: int) -> int:
    """The key/value head that query head ``head`` (0-based) reads under grouped-query
    attention: query heads g·H/G .. (g+1)·H/G - 1 share key/value head g.

    Raises:
        ValueError: ``head`` out of range, or G not dividing H.
    """
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if not 0 <= head < num_heads:
        raise ValueError(f"head {head} is out of range: the model has {num_heads} heads (0..{num_heads - 1})")
    return head // (num_heads // num_kv_heads)


def head_label(head: int, num_heads: int, num_kv_heads: int | None = None) -> str:
    """'h5' for a head of its own; 'h5 (kv2)' under grouped-query attention, naming the
    key/value head it shares with the other heads of its group. 0-based, like layers."""
    if num_kv_heads is None or num_kv_heads == num_heads:
        kv_group(head, num_heads, num_heads)  # validates the range
        return f"h{head}"
    return f"h{head} (kv{kv_group(head, num_heads, num_kv_heads)})"


SINK_NOTE = (
    "learned attention sinks: each head's softmax also covers a learned sink logit that is no token, "
    "so a row's weights sum to 1 - the sink's share (shown as 'logit sink')"
)


def layer_list(layers: tuple[int, ...]) -> str:
    """'3, 7, 11' (at most 12 named, then how many more)."""
    shown = ", ".join(map(str, layers[:12]))
    return shown + (f" and {len(layers) - 12} more" if len(layers) > 12 else "")


def hybrid_note(attention_layers: tuple[int, ...], num_layers: int) -> str:
    return (
        f"hybrid: {len(attention_layers)} of the {num_layers} layers have softmax attention "
        f"(layers {layer_list(attention_layers)}); the others (linear attention, state-space or "
        "convolution layers) have no attention weights"
    )


def structure_notes(causal: bool, num_heads: int, num_kv_heads: int, attention_sinks: bool = False) -> list[str]:
    """One line per structural fact a view of this model's weights should state."""
    notes: list[str] = []
    if causal:
        notes.append("causal (decoder): each token attends only to itself and earlier tokens")
    if num_kv_heads != num_heads:
        notes.append(f"grouped-query attention: {num_heads} query heads share {num_kv_heads} key/value heads")
    if attention_sinks:
        notes.append(SINK_NOTE)
    return notes
