"""StableLM (StableLM-3B-4E1T, StableLM 2): the Llama stack with LayerNorms, partial
rotary embeddings and, optionally, a parallel residual and per-head q/k LayerNorms.

Deltas from llama.py:

    Norm       LayerNorm with weight and bias (``layer_norm_eps``), not RMSNorm
    RoPE       only the first ``partial_rotary_factor``·D dims of each head rotate (rope.py)
    biases     q/k/v with ``use_qkv_bias``; never on W^O or the MLP
    q/k norms  with ``qk_layernorm``: a LayerNorm of its own (weight, no bias) for each
               head's q (and each key/value head's k), over D, before RoPE
    block      with ``use_parallel_residual`` (GPT-J's and GPT-NeoX's layout), one norm
               feeds both sub-layers and both add to the residual at once:
                   x = x + Attention(Norm(x)) + MLP(Norm(x))
               else the pre-norm block of decoder.py

``ParallelBlock`` is shared with Cohere (cohere.py). torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import Mask, MultiHeadAttention, QKTransform
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from .fields import number
from .llama import LlamaConfig, LlamaDecoder, SwiGLU, attention_options
from .qwen3 import QKNormAttention
from .rope import rope_config

MODEL_TYPES = ("stablelm",)
PREFIXES = ("model.",)


@dataclass(frozen=True)
class StableLmConfig(LlamaConfig):
    qk_layernorm: bool = False
    parallel_residual: bool = False


class ParallelBlock(nn.Module):
    """One layer whose attention and MLP read the same normed input and add to the
    residual together: x + Attention(Norm(x)) + MLP(Norm(x))."""

    def __init__(self, attn: MultiHeadAttention, attn_norm: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.attn_norm, self.attn, self.mlp = attn_norm, attn, mlp

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        # 1. One norm for both sub-layers.
        h = self.attn_norm(x)  # (B, L, E)
        # 2. Attention and MLP side by side, summed in transformers' order.
        a, weights = self.attn(h, mask=mask, qk_transform=qk_transform, request=request)  # (B, L, E), (B, H, R, S)
        return x + tap("attn_out", a) + tap("mlp_out", self.mlp(h)), weights


class PerHeadLayerNorm(nn.Module):
    """A LayerNorm (weight, no bias) of its own for each of ``heads`` heads, over D."""

    def __init__(self, heads: int, dim: int, eps: float) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(dim, eps=eps, bias=False) for _ in range(heads))

    def forward(self, x: Tensor) -> Tensor:
        # x (B, heads, T, D): head h through norm h.
        return torch.cat([norm(part) for norm, part in zip(self.norms, x.split(1, dim=1), strict=True)], dim=1)


class StableLmDecoder(LlamaDecoder):
    config: StableLmConfig

    def make_norm(self, dim: int) -> nn.Module:
        return nn.LayerNorm(dim, eps=self.config.rms_norm_eps)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        if not c.qk_layernorm:
            return super().make_attention(layer)
        return QKNormAttention(
            c.hidden_size,
            c.num_attention_heads,
            **attention_options(c),
            q_norm=PerHeadLayerNorm(c.num_attention_heads, c.head_dim, c.rms_norm_eps),
            k_norm=PerHeadLayerNorm(c.num_key_value_heads, c.head_dim, c.rms_norm_eps),
        )

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act)

    def make_block(self, layer: int) -> nn.Module:
        if not self.config.parallel_residual:
            return super().make_block(layer)
        return ParallelBlock(self.make_attention(layer), self.make_norm(self.config.hidden_size), self.make_mlp(layer))


def build(config: dict[str, Any]) -> StableLmDecoder:
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    head_dim = hidden // heads  # StableLM ignores any head_dim in its config
    layers = int(config["num_hidden_layers"])
    base = LlamaConfig.from_dict(
        config,
        head_dim=head_dim,
        qkv_bias=bool(config.get("use_qkv_bias", False)),
        o_bias=False,
        mlp_bias=False,
        rms_norm_eps=number(config, "layer_norm_eps", 1e-5, above=0.0),  # the LayerNorms' eps
        ropes=(rope_config(config, head_dim, partial_rotary=True),) * layers,
    )
    return StableLmDecoder(
        StableLmConfig(
            **vars(base),
            qk_layernorm=bool(config.get("qk_layernorm", False)),
            parallel_residual=bool(config.get("use_parallel_residual", False)),
        )
    )


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.self_attn\.([qk])_layernorm\.norms\.(\d+)\.weight", r"blocks.\1.attn.\2_norm.norms.\3.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
    (r"norm\.(weight|bias)", r"final_norm.\1"),
)
