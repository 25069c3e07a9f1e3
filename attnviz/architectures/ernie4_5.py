"""ERNIE 4.5 (dense, ``ernie4_5``): the Llama stack with GLM's interleaved rotary
embeddings over the whole head, in float32, and one switch for every bias.

Deltas from llama.py:

    RoPE     the pairs (2i, 2i + 1) of each head turned by position · inv_freq[i]
             (glm.py's rotation, every dim), cos/sin and the rotation in float32
    biases   ``use_bias`` on q/k/v/o and on the MLP

torch only.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..nn.attention import QKTransform
from . import llama
from .glm import interleaved_partial_rotary
from .llama import LlamaConfig, LlamaDecoder

MODEL_TYPES = ("ernie4_5",)
PREFIXES = llama.PREFIXES
RULES = llama.RULES


class Ernie45Decoder(LlamaDecoder):
    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> list[QKTransform | None]:
        rotate = interleaved_partial_rotary(self.config.rope, input_ids.size(1), x.float())

        def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            qf, kf = rotate(q.float(), k.float())  # in float32, as transformers rotates
            return qf.to(q.dtype), kf.to(k.dtype)

        return [apply] * self.num_layers


def build(config: dict[str, Any]) -> Ernie45Decoder:
    bias = bool(config.get("use_bias", False))
    return Ernie45Decoder(LlamaConfig.from_dict(config, qkv_bias=bias, o_bias=bias, mlp_bias=bias))
