"""GLM-4 (``glm``: GLM-4-9B; ``glm4``: GLM-4-0414): the Llama stack with partial rotary
embeddings on interleaved pairs, a fused gate/up projection and, in ``glm4``, a norm
after each sub-layer too.

Deltas from llama.py:

    RoPE      only the first R = ``partial_rotary_factor``·D dims of each head rotate
              (0.5 by default), in interleaved pairs (2i, 2i + 1) turned by
              position · inv_freq[i] (cohere.py's layout on a part of the head)
    biases    ``attention_bias`` on q/k/v; never on W^O or the MLP
    MLP       ``gate_up_proj`` is W_gate and W_up stacked, split in ``convert`` (phi3.py)
    glm4      the sandwich of gemma.py: x = x + Norm_post_attn(Attn(Norm_in(x)));
              x = x + Norm_post_mlp(MLP(Norm_pre_mlp(x))), every norm an RMSNorm

torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import QKTransform
from . import phi3
from .cohere import rotate_interleaved
from .fields import whole
from .gemma import SandwichBlock
from .llama import LlamaConfig, LlamaDecoder
from .rope import RopeConfig, rope_config

MODEL_TYPES = ("glm", "glm4")
PREFIXES = ("model.",)


@dataclass(frozen=True)
class GlmConfig(LlamaConfig):
    sandwich: bool = False  # glm4: a norm after each sub-layer as well


def interleaved_partial_rotary(rope: RopeConfig, length: int, like: Tensor) -> QKTransform:
    """RoPE on the pairs (2i, 2i + 1) of the first 2·⌈R/2⌉ dims, each turned by
    position · inv_freq[i]; the other dims pass through. cos/sin in ``like``'s dtype."""
    cos, sin = rope.cos_sin(length, like)  # (S, R'), both halves alike
    half = cos.size(-1) // 2
    cos = cos[..., :half].repeat_interleave(2, dim=-1)  # (S, R'): each angle twice, side by side
    sin = sin[..., :half].repeat_interleave(2, dim=-1)
    width = cos.size(-1)

    def turn(x: Tensor) -> Tensor:
        rot, rest = x[..., :width], x[..., width:]
        return torch.cat((rot * cos + rotate_interleaved(rot) * sin, rest), dim=-1)

    def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return turn(q), turn(k)  # (B, H, L, D), (B, G, S, D)

    return apply


class GlmDecoder(LlamaDecoder):
    config: GlmConfig

    def make_block(self, layer: int) -> nn.Module:
        if not self.config.sandwich:
            return super().make_block(layer)
        e = self.config.hidden_size
        return SandwichBlock(
            attn=self.make_attention(layer),
            attn_norm=self.make_norm(e),
            post_attn_norm=self.make_norm(e),
            mlp=self.make_mlp(layer),
            mlp_norm=self.make_norm(e),
            post_mlp_norm=self.make_norm(e),
        )

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> list[QKTransform | None]:
        return [interleaved_partial_rotary(self.config.rope, input_ids.size(1), x)] * self.num_layers


def build(config: dict[str, Any]) -> GlmDecoder:
    heads = int(config["num_attention_heads"])
    head_dim = whole(config, "head_dim", int(config["hidden_size"]) // heads)
    # transformers' GLM configs default to half the head (its "assign default for BC").
    rope = rope_config({"partial_rotary_factor": 0.5, **config}, head_dim, partial_rotary=True)
    layers = int(config["num_hidden_layers"])
    bias = bool(config.get("attention_bias", False))
    base = LlamaConfig.from_dict(config, ropes=(rope,) * layers, qkv_bias=bias, o_bias=False, mlp_bias=False)
    return GlmDecoder(GlmConfig(**vars(base), sandwich=config.get("model_type") == "glm4"))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    # glm: post_attention_layernorm is the pre-MLP norm (Llama's name); glm4 keeps that name
    # for its pre-MLP norm too and adds post_self_attn_ / post_mlp_layernorm.
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.post_self_attn_layernorm\.weight", r"blocks.\1.post_attn_norm.weight"),
    (r"layers\.(\d+)\.post_mlp_layernorm\.weight", r"blocks.\1.post_mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.gate_up_proj\.weight", r"blocks.\1.mlp.gate_up.weight"),  # split in convert()
    (r"layers\.(\d+)\.mlp\.down_proj\.weight", r"blocks.\1.mlp.down.weight"),
    (r"norm\.weight", r"final_norm.weight"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split the fused gate_up_proj into gate and up (phi3.py's split)."""
    return phi3.convert(tensors, config)
