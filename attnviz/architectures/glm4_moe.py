"""GLM-4.5 (``glm4_moe``: GLM-4.5, GLM-4.5-Air, GLM-4.6): the Llama stack with partial
rotary embeddings, optional per-head q/k norms, and DeepSeek-V3's mixture of experts
after the first dense layers.

Deltas from llama.py:

    RoPE      only the first R = ``partial_rotary_factor``·D dims of each head rotate
              (0.5 by default), in Llama's halves (i, i + R/2): rope.py's partial rotary
    q/k norm  with ``use_qk_norm``: an RMSNorm over each head's D (one (D,) weight for all
              heads, as qwen3.py), before RoPE
    biases    ``attention_bias`` on q/k/v; never on W^O
    MLP       layers from ``first_k_dense_replace`` on: grouped_moe.py's experts
              (``n_routed_experts`` of ``moe_intermediate_size``, sigmoid router with
              group-limited top-k, ``n_shared_experts``·``moe_intermediate_size`` shared);
              the first layers a dense SwiGLU of ``intermediate_size``

dots1 (rednote's dots.llm1) is the same stack with Qwen3's attention: RoPE over the whole
head, the per-head q/k norms always, sliding windows on the ``sliding_attention`` layers of
``layer_types``; ``n_shared_experts`` may be none, ``norm_topk_prob`` is off by default.

torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from .fields import given, sequence, whole
from .grouped_moe import GroupedMoE, GroupedTopkRouter
from .llama import LlamaConfig, LlamaDecoder, SwiGLU, _windows_of
from .moe import convert as moe_convert
from .qwen3 import QK_NORM_RULES, qk_norm_attention
from .rope import rope_config

MODEL_TYPES = ("glm4_moe", "dots1")
PREFIXES = ("model.",)


@dataclass(frozen=True)
class Glm4MoeConfig(LlamaConfig):
    qk_norm: bool = False
    first_dense: int = 1  # layers before this one have a dense MLP
    num_experts: int = 1
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    shared_experts: int = 1
    groups: int = 1
    top_groups: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0


class Glm4MoeDecoder(LlamaDecoder):
    config: Glm4MoeConfig

    def make_attention(self, layer: int) -> MultiHeadAttention:
        return qk_norm_attention(self.config) if self.config.qk_norm else super().make_attention(layer)

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        if layer < c.first_dense:
            return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act)
        router = GroupedTopkRouter(
            c.hidden_size,
            c.num_experts,
            c.num_experts_per_tok,
            c.groups,
            c.top_groups,
            c.norm_topk_prob,
            c.routed_scaling_factor,
        )
        inner = c.moe_intermediate_size
        return GroupedMoE(router, c.num_experts, c.hidden_size, inner, inner * c.shared_experts, c.hidden_act)


def build(config: dict[str, Any]) -> Glm4MoeDecoder:
    dots = config.get("model_type") == "dots1"
    heads = int(config["num_attention_heads"])
    head_dim = whole(config, "head_dim", int(config["hidden_size"]) // heads)
    layers = int(config["num_hidden_layers"])
    # transformers' GLM-4.5 config defaults to half the head; dots1 rotates all of it.
    rope = rope_config(config if dots else {"partial_rotary_factor": 0.5, **config}, head_dim, partial_rotary=not dots)
    bias = bool(config.get("attention_bias", False))
    fields: dict[str, Any] = dict(ropes=(rope,) * layers, qkv_bias=bias, o_bias=dots and bias, mlp_bias=False)
    if dots:
        window = config.get("sliding_window")
        first = whole(config, "max_window_layers", layers, low=0)
        types = sequence(
            config,
            "layer_types",
            ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(layers)],
        )
        if window is None and "sliding_attention" in types:
            raise ValueError("sliding_attention layers need a sliding_window")
        fields["windows"] = _windows_of(types, window, "dots1", layers)
    base = LlamaConfig.from_dict(config, **fields)
    return Glm4MoeDecoder(
        Glm4MoeConfig(
            **vars(base),
            qk_norm=dots or bool(config.get("use_qk_norm", False)),
            first_dense=int(config.get("first_k_dense_replace", 0 if dots else 1)),
            num_experts=whole(config, "n_routed_experts", given(config, "num_local_experts", 1)),
            num_experts_per_tok=int(config["num_experts_per_tok"]),
            moe_intermediate_size=int(config["moe_intermediate_size"]),
            shared_experts=whole(config, "n_shared_experts", 0 if dots else 1, low=0),
            groups=whole(config, "n_group", 1),
            top_groups=whole(config, "topk_group", 1),
            norm_topk_prob=bool(config.get("norm_topk_prob", not dots)),
            routed_scaling_factor=float(config.get("routed_scaling_factor", 1.0)),
        )
    )


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    *QK_NORM_RULES,
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.gate\.weight", r"blocks.\1.mlp.router.weight"),
    (r"layers\.(\d+)\.mlp\.gate\.e_score_correction_bias", r"blocks.\1.mlp.router.e_score_correction_bias"),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.experts.\2.\3.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.experts.\2"),  # split in convert()
    (r"layers\.(\d+)\.mlp\.shared_experts\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.shared.\2.weight"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),  # the dense layers
    (r"norm\.weight", r"final_norm.weight"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split transformers' fused in-memory expert layout, if that is what was saved (moe.py)."""
    return moe_convert(tensors, config)
