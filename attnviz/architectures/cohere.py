"""Cohere (Command R): the Llama stack with one bias-free LayerNorm feeding a parallel
block, and rotary embeddings on interleaved pairs.

Deltas from llama.py:

    Norm(x)   = (x - mean(x)) / √(var(x) + eps) · w      a LayerNorm with a weight and no
                                                         bias (``layer_norm_eps``), float32
    block     x = x + Attention(Norm(x)) + MLP(Norm(x))  one norm, the two sub-layers in
                                                         parallel (stablelm.ParallelBlock)
    RoPE      rotates the interleaved pairs (2i, 2i + 1) of q and k by position · inv_freq[i]
              (GPT-J's layout), not Llama's halves (i, i + D/2); in float32
    q/k norms with ``use_qk_norm``: the same LayerNorm over D, with a weight of its own for
              every head, (H, D) for q and (G, D) for k, before RoPE
    biases    ``attention_bias`` on q/k/v/o; none in the MLP

``logit_scale`` multiplies the LM head's logits, which we never compute. torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention, QKTransform
from .fields import number, whole
from .llama import LlamaConfig, LlamaDecoder, SwiGLU, attention_options
from .qwen3 import QKNormAttention
from .stablelm import ParallelBlock

MODEL_TYPES = ("cohere",)
PREFIXES = ("model.",)


@dataclass(frozen=True)
class CohereConfig(LlamaConfig):
    qk_norm: bool = False


class CohereLayerNorm(nn.Module):
    """LayerNorm over the last dim with weight ``shape`` and no bias, in float32.

    ``shape`` (E,) for the residual stream; (heads, D) for the per-head q/k norms, whose
    input (B, heads, T, D) meets weight row h in head h."""

    def __init__(self, shape: tuple[int, ...], eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(shape))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        mean = h.mean(-1, keepdim=True)
        variance = (h - mean).pow(2).mean(-1, keepdim=True)
        h = (h - mean) * torch.rsqrt(variance + self.eps)
        weight = self.weight.float() if self.weight.dim() == 1 else self.weight.float()[:, None, :]  # (E,) | (H, 1, D)
        return (weight * h).to(x.dtype)


def rotate_interleaved(x: Tensor) -> Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...) over the last dim."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def interleaved_rotary(config: LlamaConfig, length: int, like: Tensor) -> QKTransform:
    """RoPE on the pairs (2i, 2i + 1), each turned by position · inv_freq[i], in float32."""
    rope = config.rope
    inv_freq, scaling = rope.frequencies(length)
    positions = torch.arange(length, device=like.device).float()  # (S,)
    freqs = positions[:, None] * inv_freq.to(device=like.device, dtype=torch.float)  # (S, D/2)
    angles = torch.repeat_interleave(freqs, 2, dim=-1)  # (S, D): each angle twice, side by side
    cos, sin = (angles.cos() * scaling).to(like.dtype).float(), (angles.sin() * scaling).to(like.dtype).float()

    def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        qf, kf = q.float(), k.float()  # (B, H, L, D), (B, G, S, D)
        q_rot, k_rot = qf * cos + rotate_interleaved(qf) * sin, kf * cos + rotate_interleaved(kf) * sin
        return q_rot.to(q.dtype), k_rot.to(k.dtype)

    return apply


class CohereDecoder(LlamaDecoder):
    config: CohereConfig

    def make_norm(self, dim: int) -> nn.Module:
        return CohereLayerNorm((dim,), self.config.rms_norm_eps)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        if not c.qk_norm:
            return super().make_attention(layer)
        return QKNormAttention(
            c.hidden_size,
            c.num_attention_heads,
            **attention_options(c),
            q_norm=CohereLayerNorm((c.num_attention_heads, c.head_dim), c.rms_norm_eps),
            k_norm=CohereLayerNorm((c.num_key_value_heads, c.head_dim), c.rms_norm_eps),
        )

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act)

    def make_block(self, layer: int) -> nn.Module:
        return ParallelBlock(self.make_attention(layer), self.make_norm(self.config.hidden_size), self.make_mlp(layer))

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> list[QKTransform | None]:
        return [interleaved_rotary(self.config, input_ids.size(1), x)] * self.num_layers


def build(config: dict[str, Any]) -> CohereDecoder:
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    base = LlamaConfig.from_dict(
        config,
        head_dim=whole(config, "head_dim", hidden // heads),
        mlp_bias=False,
        rms_norm_eps=number(config, "layer_norm_eps", 1e-5, above=0.0),  # the LayerNorms' eps
    )
    return CohereDecoder(CohereConfig(**vars(base), qk_norm=bool(config.get("use_qk_norm", False))))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.self_attn\.([qk])_norm\.weight", r"blocks.\1.attn.\2_norm.weight"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
    (r"norm\.weight", r"final_norm.weight"),
)
