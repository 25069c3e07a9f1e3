"""Qwen3: the Llama stack with an RMSNorm on each head's queries and keys.

    q_h = RMSNorm_q(x·W_h^Q),  k_g = RMSNorm_k(x·W_g^K)    over the head dim D, one
                                                           weight (D,) shared by all heads,
                                                           before RoPE

Everything else as Qwen2: SwiGLU MLP, grouped-query attention, ``attention_bias`` on
q/k/v/o, sliding windows only with ``use_sliding_window`` (on the ``layer_types`` layers).
``QKNormAttention`` is shared with Qwen3-MoE and Gemma 3 (there with Gemma's (1 + w) norm).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..nn.attention import Attend, MaskLike, MultiHeadAttention, QKTransform, eager_attention
from . import llama
from .llama import LlamaConfig, LlamaDecoder, RMSNorm, attention_options

MODEL_TYPES = ("qwen3",)
PREFIXES = llama.PREFIXES


class QKNormAttention(MultiHeadAttention):
    """Multi-head attention whose split heads q (B, H, L, D) and k (B, G, S, D) are
    normed over D (``q_norm``, ``k_norm``) before any position transform."""

    def __init__(self, *args: Any, q_norm: nn.Module, k_norm: nn.Module, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.q_norm, self.k_norm = q_norm, k_norm

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: MaskLike = None,
        qk_transform: QKTransform | None = None,
        request: Attend = eager_attention,
        score_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        def normed(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            q, k = self.q_norm(q), self.k_norm(k)  # (B, H, L, D), (B, G, S, D)
            return (q, k) if qk_transform is None else qk_transform(q, k)

        return super().forward(query, key, value, mask, normed, request, score_bias)


def qk_norm_attention(c: LlamaConfig, norm: type[nn.Module] = RMSNorm) -> QKNormAttention:
    return QKNormAttention(
        c.hidden_size,
        c.num_attention_heads,
        **attention_options(c),
        q_norm=norm(c.head_dim, c.rms_norm_eps),
        k_norm=norm(c.head_dim, c.rms_norm_eps),
    )


class Qwen3Decoder(LlamaDecoder):
    def make_attention(self, layer: int) -> MultiHeadAttention:
        return qk_norm_attention(self.config)


def build(config: dict[str, Any]) -> Qwen3Decoder:
    return Qwen3Decoder(LlamaConfig.from_dict(config))


QK_NORM_RULES = ((r"layers\.(\d+)\.self_attn\.([qk])_norm\.weight", r"blocks.\1.attn.\2_norm.weight"),)
RULES = (*llama.RULES, *QK_NORM_RULES)
