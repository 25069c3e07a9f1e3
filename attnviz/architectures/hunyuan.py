"""Hunyuan (``hunyuan_v1_dense``, ``hunyuan_v1_moe``: Hunyuan-A13B): the Llama stack with
per-head q/k norms applied after RoPE, NTK scaling with a fixed α, and in the MoE model
experts beside a shared MLP in every layer.

Deltas from llama.py:

    q/k norm  an RMSNorm over each head's D on q and k (``query_layernorm``,
              ``key_layernorm``), *after* the rotation (qwen3.py's norms come before): a
              part of the position transform here, so explain and the q/k taps read the
              normed q and k the scores use
    RoPE      ``rope_type`` dynamic with an ``alpha``: a fixed θ' = θ · α^(D/(D-2)) for
              every length (transformers' ``ntk_alpha``), then plain RoPE
    biases    ``attention_bias`` on q/k/v/o; none in the MLP
    MoE       (hunyuan_v1_moe) every layer: Σ_{e in top} w_e · SwiGLU_e(x) + SwiGLU_shared(x),
              p = softmax(x · W_gᵀ) in float32, the ``moe_topk`` largest renormalised to sum
              1; experts and the shared MLP ``intermediate_size`` wide (grouped_moe.py's loop)

torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import MultiHeadAttention, QKTransform
from .fields import given, whole
from .grouped_moe import GroupedMoE
from .llama import LlamaConfig, LlamaDecoder, RMSNorm
from .moe import convert as moe_convert
from .rope import rope_config

MODEL_TYPES = ("hunyuan_v1_dense", "hunyuan_v1_moe")
PREFIXES = ("model.",)


class SoftmaxTopkRouter(nn.Module):
    """p = softmax(x · W_gᵀ) in float32; the k largest, renormalised to sum 1."""

    def __init__(self, hidden: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"moe_topk={top_k} must be between 1 and the {num_experts} experts")
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))
        self.top_k = top_k

    def forward(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """flat (T, E) -> the chosen experts (T, k) and their weights (T, k), float32."""
        probs = torch.softmax(nn.functional.linear(flat.float(), self.weight.float()), dim=1)  # (T, X)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        return chosen, weights / weights.sum(dim=-1, keepdim=True)


@dataclass(frozen=True)
class HunyuanConfig(LlamaConfig):
    num_experts: int = 0  # 0: the dense model
    top_k: int = 1


class HunyuanDecoder(LlamaDecoder):
    config: HunyuanConfig

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        if not c.num_experts:
            return super().make_mlp(layer)
        router = SoftmaxTopkRouter(c.hidden_size, c.num_experts, c.top_k)
        inner = c.intermediate_size
        return GroupedMoE(router, c.num_experts, c.hidden_size, inner, inner, c.hidden_act)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        attn = super().make_attention(layer)
        # Normed after the rotation, so part of the position transform (``qk_transforms``):
        # what explain and the taps read as q and k is then what the scores use.
        attn.q_post_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        attn.k_post_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        return attn

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        rotated = super().qk_transforms(input_ids, x)

        def then_normed(rotate: QKTransform | None, attn: Any) -> QKTransform:
            q_norm: nn.Module = attn.q_post_norm
            k_norm: nn.Module = attn.k_post_norm

            def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
                if rotate is not None:
                    q, k = rotate(q, k)
                return q_norm(q), k_norm(k)  # (B, H, L, D), (B, G, S, D)

            return apply

        return [then_normed(qk, block.attn) for qk, block in zip(rotated, self.blocks, strict=True)]


def build(config: dict[str, Any]) -> HunyuanDecoder:
    heads = int(config["num_attention_heads"])
    head_dim = whole(config, "head_dim", int(config["hidden_size"]) // heads)
    layers = int(config["num_hidden_layers"])
    params: Any = config.get("rope_parameters")
    if not params:  # absent, null or {}: the older rope_scaling, as transformers reads it
        params = given(config, "rope_scaling", {})
    alpha = params.get("alpha") if isinstance(params, dict) else None
    kind = params.get("rope_type", params.get("type")) if isinstance(params, dict) else None
    if kind == "dynamic" and alpha:
        plain = {k: v for k, v in params.items() if k not in ("rope_type", "type", "alpha", "factor")}
        rope = rope_config({**config, "rope_parameters": {**plain, "rope_type": "default"}}, head_dim)
        # transformers: base = rope_theta * alpha ** (dim / (dim - 2)), in Python floats.
        rope = replace(rope, theta=rope.theta * float(alpha) ** (head_dim / (head_dim - 2)))
    else:
        rope = rope_config(config, head_dim)
    base = LlamaConfig.from_dict(config, ropes=(rope,) * layers, mlp_bias=False)
    if config.get("model_type") != "hunyuan_v1_moe":
        return HunyuanDecoder(HunyuanConfig(**vars(base)))
    experts, top_k = config.get("num_experts"), config.get("moe_topk")
    if not isinstance(experts, int) or not isinstance(top_k, int):
        raise UnsupportedArchitectureError(
            "num_experts or moe_topk given per layer is not implemented for 'hunyuan_v1_moe' by the own engine",
            setting="num_experts",
        )
    return HunyuanDecoder(HunyuanConfig(**vars(base), num_experts=experts, top_k=top_k))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.self_attn\.query_layernorm\.weight", r"blocks.\1.attn.q_post_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.key_layernorm\.weight", r"blocks.\1.attn.k_post_norm.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
    # hunyuan_v1_moe: the router (gate.wg), the experts one by one or fused, the shared MLP.
    (r"layers\.(\d+)\.mlp\.gate\.wg\.weight", r"blocks.\1.mlp.router.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.experts.\2.\3.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.experts.\2"),  # split in convert()
    (r"layers\.(\d+)\.mlp\.shared_mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.shared.\2.weight"),
    (r"norm\.weight", r"final_norm.weight"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split transformers' fused in-memory expert layout, if that is what was saved (moe.py)."""
    return moe_convert(tensors, config)
