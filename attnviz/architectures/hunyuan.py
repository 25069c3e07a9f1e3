"""Hunyuan dense (``hunyuan_v1_dense``): the Llama stack with per-head q/k norms applied
after RoPE, and NTK scaling with a fixed α.

Deltas from llama.py:

    q/k norm  an RMSNorm over each head's D on q and k (``query_layernorm``,
              ``key_layernorm``), *after* the rotation (qwen3.py's norms come before)
    RoPE      ``rope_type`` dynamic with an ``alpha``: a fixed θ' = θ · α^(D/(D-2)) for
              every length (transformers' ``ntk_alpha``), then plain RoPE
    biases    ``attention_bias`` on q/k/v/o; none in the MLP

torch only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import Tensor, nn

from ..nn.attention import Attend, MaskLike, MultiHeadAttention, QKTransform, eager_attention
from .llama import LlamaConfig, LlamaDecoder, RMSNorm, attention_options
from .rope import rope_config

MODEL_TYPES = ("hunyuan_v1_dense",)
PREFIXES = ("model.",)


class PostRotaryNormAttention(MultiHeadAttention):
    """Multi-head attention whose q (B, H, L, D) and k (B, G, S, D) are normed over D
    after the position transform."""

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
            if qk_transform is not None:
                q, k = qk_transform(q, k)
            return self.q_norm(q), self.k_norm(k)  # (B, H, L, D), (B, G, S, D)

        return super().forward(query, key, value, mask, normed, request, score_bias)


class HunyuanDecoder(LlamaDecoder):
    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        return PostRotaryNormAttention(
            c.hidden_size,
            c.num_attention_heads,
            **attention_options(c),
            q_norm=RMSNorm(c.head_dim, c.rms_norm_eps),
            k_norm=RMSNorm(c.head_dim, c.rms_norm_eps),
        )


def build(config: dict[str, Any]) -> HunyuanDecoder:
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    layers = int(config["num_hidden_layers"])
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    alpha = params.get("alpha") if isinstance(params, dict) else None
    kind = params.get("rope_type", params.get("type")) if isinstance(params, dict) else None
    if kind == "dynamic" and alpha:
        plain = {k: v for k, v in params.items() if k not in ("rope_type", "type", "alpha", "factor")}
        rope = rope_config({**config, "rope_parameters": {**plain, "rope_type": "default"}}, head_dim)
        # transformers: base = rope_theta * alpha ** (dim / (dim - 2)), in Python floats.
        rope = replace(rope, theta=rope.theta * float(alpha) ** (head_dim / (head_dim - 2)))
    else:
        rope = rope_config(config, head_dim)
    return HunyuanDecoder(LlamaConfig.from_dict(config, ropes=(rope,) * layers, mlp_bias=False))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.self_attn\.query_layernorm\.weight", r"blocks.\1.attn.q_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.key_layernorm\.weight", r"blocks.\1.attn.k_norm.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
    (r"norm\.weight", r"final_norm.weight"),
)
