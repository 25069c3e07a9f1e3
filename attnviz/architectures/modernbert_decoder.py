"""ModernBERT-decoder (``modernbert-decoder``: the Ettin decoders): ModernBERT's stack as a
causal language model.

Deltas from modernbert.py:

    mask        causal: token i sees tokens 0..i; a ``sliding_attention`` layer only its last
                ``local_attention // 2`` of them (i - w < j <= i), where the encoder sees w
                either side
    attention   separate W^Q, W^K, W^V (``q_proj``, ``k_proj``, ``v_proj``) in place of the
                fused ``Wqkv``; W^O is still ``Wo``

Everything else as ModernBERT: the normed embeddings, no attention norm in layer 0,
RoPE with θ per layer type, the GeGLU MLP, the final norm. torch only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from torch import Tensor

from ..nn.attention import Mask, QKTransform
from . import modernbert
from .base import ForwardOutput, layer_loop
from .modernbert import GLOBAL, LOCAL, ModernBert, ModernBertConfig
from .rope import RopeConfig, rotary

MODEL_TYPES = ("modernbert-decoder",)
PREFIXES = modernbert.PREFIXES


class ModernBertDecoder(ModernBert):
    def __init__(self, c: ModernBertConfig) -> None:
        super().__init__(c)
        self.causal = True

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_layer: int | None = None,
        *,
        layers: Collection[int] | None = None,
        queries: Sequence[int] | None = None,
        fused: bool = True,
    ) -> ForwardOutput:
        """As ``ModernBert.forward``, with causal masks (windowed on the local layers)."""
        c = self.config
        length = input_ids.size(1)
        # 1. Token embeddings, normed.
        x = self.embed_norm(self.tokens(input_ids))  # (B, S, E)
        # 2. One rotary transform and one mask per layer type: described, never materialised.
        rope: dict[str, QKTransform] = {
            GLOBAL: rotary(RopeConfig("default", c.global_theta, c.head_dim, c.max_position_embeddings), length, x),
            LOCAL: rotary(RopeConfig("default", c.local_theta, c.head_dim, c.max_position_embeddings), length, x),
        }
        padding = None if attention_mask is None else attention_mask.bool()  # (B, S)
        masks = {
            GLOBAL: Mask(causal=True, padding=padding),
            LOCAL: Mask(causal=True, window=c.window, padding=padding),
        }
        # 3. The layers.
        last = self.num_layers - 1 if max_layer is None else max_layer
        requests = self.row_requests(last, layers, queries, fused)
        kinds = c.layer_types
        x, attentions = layer_loop(
            x, last + 1, lambda n, x: self.blocks[n](x, masks[kinds[n]], rope[kinds[n]], requests[n])
        )
        if last == self.num_layers - 1:
            x = self.final_norm(x)
        return ForwardOutput(hidden_states=x, attentions=attentions)


def build(config: dict[str, Any]) -> ModernBertDecoder:
    return ModernBertDecoder(ModernBertConfig.from_dict(config))


RULES = (
    *modernbert.RULES,
    (r"layers\.(\d+)\.attn\.([qkv])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
)
