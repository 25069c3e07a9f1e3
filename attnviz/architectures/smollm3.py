"""SmolLM3: the Llama stack with rotary embeddings left out of some layers (NoPE).

Deltas from llama.py:

    RoPE     only on the layers ``no_rope_layers`` marks 1; a layer marked 0 attends with
             no position information at all (q·kᵀ of the raw projections; the causal
             mask is then its only sense of order). Without the list, every
             ``no_rope_layer_interval``-th layer (4th by default) is NoPE.
    window   a layer of type ``sliding_attention`` (``layer_types``; by default the NoPE
             layers, when ``use_sliding_window`` and ``sliding_window`` are set) sees
             its last ``sliding_window`` tokens
    biases   ``attention_bias`` on q/k/v/o, ``mlp_bias`` on the MLP (as Llama)

torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ..nn.attention import QKTransform
from . import llama
from .fields import whole
from .llama import LlamaConfig, LlamaDecoder

MODEL_TYPES = ("smollm3",)
PREFIXES = llama.PREFIXES
RULES = llama.RULES


@dataclass(frozen=True)
class SmolLM3Config(LlamaConfig):
    rotary_layers: tuple[bool, ...] = ()  # per layer: whether q and k are rotated

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.rotary_layers) != self.num_hidden_layers:
            raise ValueError(f"no_rope_layers names {len(self.rotary_layers)} layers, not {self.num_hidden_layers}")


class SmolLM3Decoder(LlamaDecoder):
    config: SmolLM3Config

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        rotated = super().qk_transforms(input_ids, x)
        return [qk if rotary else None for qk, rotary in zip(rotated, self.config.rotary_layers, strict=True)]


def build(config: dict[str, Any]) -> SmolLM3Decoder:
    layers = int(config["num_hidden_layers"])
    interval = whole(config, "no_rope_layer_interval", 4)
    marks = config.get("no_rope_layers")
    if marks is None:
        marks = [int((layer + 1) % interval != 0) for layer in range(layers)]
    rotary = tuple(bool(mark) for mark in marks)
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if types is None:
        on = bool(config.get("use_sliding_window")) and window is not None
        types = ["sliding_attention" if on and not r else "full_attention" for r in rotary]
    if len(types) != layers:
        raise ValueError(f"layer_types names {len(types)} layers, num_hidden_layers is {layers}")
    # transformers builds the windowed mask for every sliding_attention layer from sliding_window.
    windows = tuple(None if kind == "full_attention" else window for kind in types)
    if any(kind not in ("full_attention", "sliding_attention") for kind in types) or (
        window is None and "sliding_attention" in types
    ):
        raise ValueError(f"layer_types {types} need a sliding_window, and only full or sliding attention")
    base = LlamaConfig.from_dict(config, windows=windows)
    return SmolLM3Decoder(SmolLM3Config(**vars(base), rotary_layers=rotary))
