"""Cohere2 (Command R7B, Command A): Cohere's parallel block with sliding-window layers,
and rotary embeddings on the sliding layers only.

Deltas from cohere.py:

    window    the ``sliding_attention`` layers of ``layer_types`` see their last
              ``sliding_window`` tokens (by default three of every four,
              ``sliding_window_pattern`` 4); the others attend to every earlier token
    RoPE      interleaved pairs, as Cohere, but on the sliding layers alone: the full
              layers see no position information (NoPE), their causal mask the only order
    q/k norm  none (Cohere's ``use_qk_norm`` is not read)
    block     x + Attention(Norm(x)) + MLP(Norm(x)), summed in that order

``logit_scale`` multiplies the LM head's logits, which we never compute. torch only.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..nn.attention import QKTransform
from . import cohere
from .cohere import CohereConfig, CohereDecoder, interleaved_rotary
from .fields import number, sequence, whole
from .llama import LlamaConfig, _windows_of
from .stablelm import ParallelBlock

MODEL_TYPES = ("cohere2",)
PREFIXES = cohere.PREFIXES
RULES = cohere.RULES


class Cohere2Decoder(CohereDecoder):
    def make_block(self, layer: int) -> nn.Module:
        norm = self.make_norm(self.config.hidden_size)
        return ParallelBlock(self.make_attention(layer), norm, self.make_mlp(layer))  # x + attn + mlp

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> list[QKTransform | None]:
        rotated = interleaved_rotary(self.config, input_ids.size(1), x)
        return [rotated if window is not None else None for window in self.windows]


def build(config: dict[str, Any]) -> Cohere2Decoder:
    layers = int(config["num_hidden_layers"])
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    window = config.get("sliding_window")
    period = whole(config, "sliding_window_pattern", 4)
    types = sequence(
        config, "layer_types", ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers)]
    )
    if window is None and "sliding_attention" in types:
        raise ValueError("sliding_attention layers need a sliding_window")
    base = LlamaConfig.from_dict(
        config,
        head_dim=whole(config, "head_dim", hidden // heads),
        mlp_bias=False,
        rms_norm_eps=number(config, "layer_norm_eps", 1e-5, above=0.0),
        windows=_windows_of(types, window, "cohere2", layers),
    )
    return Cohere2Decoder(CohereConfig(**vars(base), qk_norm=False))
