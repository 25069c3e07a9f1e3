"""GPT-OSS: a rotary MoE decoder whose heads each have a learned attention sink.

    sinks    one logit s_h per head joins every row's softmax as an extra column that
             belongs to no key, then is dropped: a row's visible weights sum to
             1 - sink share, where the share is e^{s_h} / (e^{s_h} + Σ_j e^{score_j})
    layers   ``layer_types``: sliding_attention layers see their last ``sliding_window``
             tokens, full_attention layers all (alternating)
    RoPE     yarn-scaled (``rope_parameters``), biases on q/k/v/o
    router   logits = x·W_rᵀ + b_r; the top k logits, softmaxed among themselves
    experts  gate_up = x·W_e + b_e, interleaved: gate = [..., 0::2], up = [..., 1::2];
             gate ≤ limit, -limit ≤ up ≤ limit;
             out = ((up + 1) · gate·σ(α·gate)) · W_down + b_down   (α = swiglu_alpha)

The experts are stored fused, (X, E, 2I) and (X, I, E), multiplied from the left (x·W),
and kept that way here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .llama import LlamaConfig, LlamaDecoder, RMSNorm

MODEL_TYPES = ("gpt_oss",)
PREFIXES = ("model.",)


@dataclass(frozen=True)
class GptOssConfig(LlamaConfig):
    num_experts: int = 1
    num_experts_per_tok: int = 1
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


class GptOssExperts(nn.Module):
    """X experts as fused tensors: gate_up (X, E, 2I) + bias (X, 2I), down (X, I, E) + bias (X, E)."""

    def __init__(self, hidden: int, inner: int, num_experts: int, alpha: float, limit: float) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden, 2 * inner))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * inner))
        self.down_proj = nn.Parameter(torch.empty(num_experts, inner, hidden))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden))
        self.alpha, self.limit = alpha, limit

    def expert(self, e: int, x: Tensor) -> Tensor:
        """Expert ``e`` on tokens x (T, E) -> (T, E)."""
        gate_up = x @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]  # (T, 2I)
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]  # interleaved, not halves
        gate = gate.clamp(min=None, max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return ((up + 1) * glu) @ self.down_proj[e] + self.down_proj_bias[e]  # (T, E)


class GptOssMoE(nn.Module):
    def __init__(self, c: GptOssConfig) -> None:
        super().__init__()
        if not 1 <= c.num_experts_per_tok <= c.num_experts:
            raise ValueError(f"num_experts_per_tok={c.num_experts_per_tok} must be between 1 and {c.num_experts}")
        self.router = nn.Linear(c.hidden_size, c.num_experts, bias=True)
        self.experts = GptOssExperts(c.hidden_size, c.intermediate_size, c.num_experts, c.swiglu_alpha, c.swiglu_limit)
        self.num_experts, self.top_k = c.num_experts, c.num_experts_per_tok

    def forward(self, x: Tensor) -> Tensor:
        b, s, e = x.shape
        flat = x.reshape(-1, e)  # (T, E)
        # 1. Route: the k largest logits, softmaxed among themselves.
        top, chosen = torch.topk(self.router(flat), self.top_k, dim=-1)  # (T, k), (T, k)
        weights = torch.softmax(top, dim=1)  # (T, k)
        # 2. Each expert on its tokens, weighted, added in ascending expert order.
        out = torch.zeros_like(flat)  # (T, E)
        for expert in range(self.num_experts):
            slot, token = torch.where((chosen == expert).T)  # transformers' order: by slot, then token
            if token.numel():
                out.index_add_(0, token, self.experts.expert(expert, flat[token]) * weights[token, slot, None])
        return out.reshape(b, s, e)


class GptOssDecoder(LlamaDecoder):
    config: GptOssConfig

    def make_norm(self, dim: int) -> nn.Module:
        return RMSNorm(dim, self.config.rms_norm_eps, weight_in_float32=True)

    def make_mlp(self, layer: int) -> nn.Module:
        return GptOssMoE(self.config)


def build(config: dict[str, Any]) -> GptOssDecoder:
    base = LlamaConfig.from_dict(config, sinks=True, mlp_bias=False)
    return GptOssDecoder(
        GptOssConfig(
            **vars(base),
            num_experts=int(config["num_local_experts"]),
            num_experts_per_tok=int(config["num_experts_per_tok"]),
            swiglu_alpha=float(config.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(config.get("swiglu_limit", 7.0)),
        )
    )


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.self_attn\.sinks", r"blocks.\1.attn.sinks"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.router\.(weight|bias)", r"blocks.\1.mlp.router.\2"),
    (r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?", r"blocks.\1.mlp.experts.\2\3"),
    (r"norm\.weight", r"final_norm.weight"),
)
