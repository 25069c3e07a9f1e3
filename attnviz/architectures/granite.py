"""Granite (IBM Granite 3): the Llama stack with three multipliers from its config.

Deltas from llama.py:

    embed      x = E[ids] · m_emb                       m_emb = ``embedding_multiplier``
    scores     softmax(q·kᵀ · m_att)                    m_att = ``attention_multiplier``,
                                                        in place of 1/√D
    residual   x = x + m_res · Attention(Norm_1(x))     m_res = ``residual_multiplier``,
               x = x + m_res · MLP(Norm_2(x))           on both sub-layers' outputs
    biases     ``attention_bias`` on q/k/v/o, ``mlp_bias`` on the MLP (as Llama)

``logits_scaling`` divides the LM head's logits, which we never compute.
torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..nn.attention import Mask, MultiHeadAttention, QKTransform
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from . import llama
from .llama import LlamaConfig, LlamaDecoder

MODEL_TYPES = ("granite",)
PREFIXES = llama.PREFIXES
RULES = llama.RULES


@dataclass(frozen=True)
class GraniteConfig(LlamaConfig):
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0


class ScaledResidualBlock(nn.Module):
    """The pre-norm block with each sub-layer's output scaled before it joins the residual."""

    def __init__(
        self, attn: MultiHeadAttention, attn_norm: nn.Module, mlp: nn.Module, mlp_norm: nn.Module, multiplier: float
    ) -> None:
        super().__init__()
        self.attn_norm, self.attn = attn_norm, attn
        self.mlp_norm, self.mlp = mlp_norm, mlp
        self.multiplier = multiplier

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        # 1. Self-attention on the normed input, scaled, added back to the residual stream.
        a, weights = self.attn(
            self.attn_norm(x), mask=mask, qk_transform=qk_transform, request=request
        )  # (B, L, E), (B, H, R, S)
        x = x + tap("attn_out", a * self.multiplier)
        # 2. The MLP, likewise.
        x = x + tap("mlp_out", self.mlp(self.mlp_norm(x)) * self.multiplier)
        return x, weights


class GraniteDecoder(LlamaDecoder):
    config: GraniteConfig

    def make_block(self, layer: int) -> nn.Module:
        c = self.config
        return ScaledResidualBlock(
            self.make_attention(layer),
            self.make_norm(c.hidden_size),
            self.make_mlp(layer),
            self.make_norm(c.hidden_size),
            c.residual_multiplier,
        )

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.tokens(input_ids) * self.config.embedding_multiplier  # (B, S, E)


def build(config: dict[str, Any]) -> GraniteDecoder:
    base = LlamaConfig.from_dict(config, scale=float(config.get("attention_multiplier", 1.0)))
    return GraniteDecoder(
        GraniteConfig(
            **vars(base),
            embedding_multiplier=float(config.get("embedding_multiplier", 1.0)),
            residual_multiplier=float(config.get("residual_multiplier", 1.0)),
        )
    )
