"""OLMo 2: the Llama stack with its norms moved after the sub-layers, and an RMSNorm
on the full query and key projections.

    x = x + Norm_post_attn(Attention(x))        no norm before the sub-layers:
    x = x + Norm_post_mlp(MLP(x))               each output is normed before it joins the residual
    q = RMSNorm_q(x·W^Q)  over all H·D query dims (one norm across heads, unlike Qwen3's per head)
    k = RMSNorm_k(x·W^K)  over all G·D key dims; both before the heads split and before RoPE

RMSNorm here multiplies by the weight before casting back ((w·x̂).to(dtype)); in float32
that is Llama's norm exactly.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..nn.attention import Mask, MultiHeadAttention, QKTransform
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from . import llama
from .llama import LlamaConfig, LlamaDecoder, RMSNorm

MODEL_TYPES = ("olmo2",)
PREFIXES = llama.PREFIXES


class NormedLinear(nn.Linear):
    """A projection followed by an RMSNorm over its whole output (OLMo 2's q and k)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, eps: float) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.norm = RMSNorm(out_features, eps, weight_in_float32=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(super().forward(x))  # (B, T, out)


class PostNormBlock(nn.Module):
    """One OLMo 2 layer: the norms come after each sub-layer, still inside the residual."""

    def __init__(self, attn: MultiHeadAttention, post_attn_norm: nn.Module, mlp: nn.Module, post_mlp_norm: nn.Module):
        super().__init__()
        self.attn, self.post_attn_norm = attn, post_attn_norm
        self.mlp, self.post_mlp_norm = mlp, post_mlp_norm

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        # 1. Self-attention on the raw residual stream, normed on the way back.
        a, weights = self.attn(x, mask=mask, qk_transform=qk_transform, request=request)  # (B, L, E), (B, H, R, S)
        x = x + tap("attn_out", self.post_attn_norm(a))
        # 2. The MLP, likewise.
        x = x + tap("mlp_out", self.post_mlp_norm(self.mlp(x)))
        return x, weights


class Olmo2Decoder(LlamaDecoder):
    rotate_in_float32 = True

    def make_norm(self, dim: int) -> nn.Module:
        return RMSNorm(dim, self.config.rms_norm_eps, weight_in_float32=True)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        attn = super().make_attention(layer)
        attn.q_proj = NormedLinear(c.hidden_size, c.num_attention_heads * c.head_dim, c.qkv_bias, c.rms_norm_eps)
        attn.k_proj = NormedLinear(c.hidden_size, c.num_key_value_heads * c.head_dim, c.qkv_bias, c.rms_norm_eps)
        return attn

    def make_block(self, layer: int) -> nn.Module:
        c = self.config
        return PostNormBlock(
            attn=self.make_attention(layer),
            post_attn_norm=self.make_norm(c.hidden_size),
            mlp=self.make_mlp(layer),
            post_mlp_norm=self.make_norm(c.hidden_size),
        )


def build(config: dict[str, Any]) -> Olmo2Decoder:
    return Olmo2Decoder(LlamaConfig.from_dict(config))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.self_attn\.([qk])_norm\.weight", r"blocks.\1.attn.\2_proj.norm.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.post_attn_norm.weight"),
    (r"layers\.(\d+)\.post_feedforward_layernorm\.weight", r"blocks.\1.post_mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"norm\.weight", r"final_norm.weight"),
)
