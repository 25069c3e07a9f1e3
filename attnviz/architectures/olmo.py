"""OLMo 1 and OLMoE: the Llama stack with OLMo's norms and clamped projections.

Deltas from llama.py (everything else, RoPE, GQA, SwiGLU, is Llama's):

    olmo    Norm(x) = (x - mean(x)) / √(var(x) + 1e-5)     a LayerNorm with no weight and no
                                                           bias (non-parametric), in float32;
                                                           eps is fixed, not read from the config
            q, k, v = clamp(x·W^{Q,K,V} + b, -c, c)        c = ``clip_qkv``, when set, before
                                                           the heads split and before RoPE
            attention_bias on q/k/v/o; no MLP bias
    olmoe   Norm = Llama's RMSNorm (weighted)
            q = clamp(RMSNorm_q(x·W^Q), -c, c)             RMSNorm over the whole q projection
            k = clamp(RMSNorm_k(x·W^K), -c, c)             (H·D dims; k: G·D), then the clamp
            v = clamp(x·W^V, -c, c)
            MLP = the router over SwiGLU experts of moe.py in every layer (``num_experts``
                  experts ``intermediate_size`` wide, top ``num_experts_per_tok``,
                  renormalised with ``norm_topk_prob``, weights cast to the model's dtype)

OLMo: Groeneveld et al. 2024, "OLMo: Accelerating the Science of Language Models" (§2.1:
non-parametric layer norm; clip_qkv is the released models' QKV clipping).
OLMoE: Muennighoff et al. 2024, "OLMoE: Open Mixture-of-Experts Language Models".
torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from .llama import LlamaConfig, RMSNorm
from .moe import RULES as MOE_RULES
from .moe import MoEConfig, MoEDecoder
from .moe import convert as moe_convert

MODEL_TYPES = ("olmo", "olmoe")
PREFIXES = ("model.",)


@dataclass(frozen=True)
class OlmoConfig(MoEConfig):
    clip_qkv: float | None = None  # |q|, |k|, |v| clamped to at most this

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clip_qkv is not None and not self.clip_qkv > 0:
            raise ValueError(f"clip_qkv={self.clip_qkv} must be positive")


class OlmoLayerNorm(nn.Module):
    """LayerNorm without weight or bias, in float32, eps 1e-5 (transformers' OlmoLayerNorm)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.layer_norm(x.float(), (self.dim,), None, None, eps=1e-5).to(x.dtype)


class ClippedLinear(nn.Linear):
    """A projection, optionally normed over its whole output, then clamped to [-clip, clip]."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, clip: float | None, norm: nn.Module | None = None
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.clip = clip
        self.norm = norm

    def forward(self, x: Tensor) -> Tensor:
        y = super().forward(x)  # (B, T, out)
        if self.norm is not None:
            y = self.norm(y)
        return y if self.clip is None else y.clamp(min=-self.clip, max=self.clip)


class OlmoDecoder(MoEDecoder):
    config: OlmoConfig

    def make_norm(self, dim: int) -> nn.Module:
        if self.config.model_type == "olmoe":
            return RMSNorm(dim, self.config.rms_norm_eps)
        return OlmoLayerNorm(dim)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        attn = super().make_attention(layer)
        q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        normed = c.model_type == "olmoe"
        attn.q_proj = ClippedLinear(
            c.hidden_size, q_out, c.qkv_bias, c.clip_qkv, RMSNorm(q_out, c.rms_norm_eps) if normed else None
        )
        attn.k_proj = ClippedLinear(
            c.hidden_size, kv_out, c.qkv_bias, c.clip_qkv, RMSNorm(kv_out, c.rms_norm_eps) if normed else None
        )
        attn.v_proj = ClippedLinear(c.hidden_size, kv_out, c.qkv_bias, c.clip_qkv)
        return attn


def build(config: dict[str, Any]) -> OlmoDecoder:
    model_type = config.get("model_type", "olmo")
    layers = int(config["num_hidden_layers"])
    clip = config.get("clip_qkv")
    moe: dict[str, Any] = {}
    if model_type == "olmoe":
        moe = dict(
            num_experts=int(config["num_experts"]),
            num_experts_per_tok=int(config["num_experts_per_tok"]),
            moe_intermediate_size=int(config["intermediate_size"]),
            sparse_layers=tuple(range(layers)),
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        )
    base = LlamaConfig.from_dict(config)
    return OlmoDecoder(
        OlmoConfig(**vars(base), model_type=model_type, clip_qkv=None if clip is None else float(clip), **moe)
    )


RULES = (
    # OLMoE's norms over the whole q and k projections (before moe's per-head q/k norm rule).
    (r"layers\.(\d+)\.self_attn\.([qk])_norm\.weight", r"blocks.\1.attn.\2_proj.norm.weight"),
    # OLMo 1 has no norm weights at all; the rest is Llama's and moe.py's names.
    *MOE_RULES,
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split transformers' fused in-memory expert layout, if that is what was saved (moe.py)."""
    return moe_convert(tensors, config)
