"""Arcee (AFM) and Apertus: the Llama stack with an ungated MLP, and for Apertus per-head
q/k norms and the xIELU activation.

Deltas from llama.py:

    MLP(x)    = W_down · act(W_up · x)      no gate (Nemotron's MLP); act ReLU² for Arcee
                                            (``hidden_act`` relu2), xIELU for Apertus:
    xIELU(x)  = a_p·x² + β·x                        x > 0
              = (e^min(x, ε) - 1 - x)·a_n + β·x     x ≤ 0
                a_p = softplus(α_p), a_n = β + softplus(α_n): α_p, α_n learned per layer
                (``mlp.act_fn.alpha_p`` / ``alpha_n``), β and ε stored beside them
    apertus   an RMSNorm over each head's D on q and k (qwen3.py), before RoPE; the layer
              norms are called ``attention_layernorm`` / ``feedforward_layernorm``
    biases    ``attention_bias`` on q/k/v/o; ``mlp_bias`` (Arcee) on the MLP

torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from .base import activation
from .fields import text
from .llama import LlamaConfig, LlamaDecoder
from .qwen3 import QK_NORM_RULES, qk_norm_attention

MODEL_TYPES = ("arcee", "apertus")
PREFIXES = ("model.",)


class XIELU(nn.Module):
    """xIELU (Huang et al. 2024), as transformers' Python version computes it."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha_p = nn.Parameter(torch.zeros(1))
        self.alpha_n = nn.Parameter(torch.zeros(1))
        self.beta: Tensor
        self.eps: Tensor
        self.register_buffer("beta", torch.tensor(0.5))
        self.register_buffer("eps", torch.tensor(-1e-6))

    def forward(self, x: Tensor) -> Tensor:
        alpha_p = nn.functional.softplus(self.alpha_p)
        alpha_n = self.beta + nn.functional.softplus(self.alpha_n)
        return torch.where(
            x > 0,
            alpha_p * x * x + self.beta * x,
            (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x,
        )


class UngatedMLP(nn.Module):
    """W_down · act(W_up · x)."""

    def __init__(self, hidden: int, inner: int, act: str, bias: bool) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, inner, bias=bias)
        self.down = nn.Linear(inner, hidden, bias=bias)
        self.act: nn.Module | Any = XIELU() if act == "xielu" else activation(act)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down(self.act(self.up(x)))
        return out


@dataclass(frozen=True)
class ArceeConfig(LlamaConfig):
    qk_norm: bool = False  # Apertus


class ArceeDecoder(LlamaDecoder):
    config: ArceeConfig

    def make_attention(self, layer: int) -> MultiHeadAttention:
        return qk_norm_attention(self.config) if self.config.qk_norm else super().make_attention(layer)

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        return UngatedMLP(c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias)


def build(config: dict[str, Any]) -> ArceeDecoder:
    apertus = config.get("model_type") == "apertus"
    base = LlamaConfig.from_dict(
        config,
        hidden_act=text(config, "hidden_act", "xielu" if apertus else "relu2"),
        mlp_bias=False if apertus else bool(config.get("mlp_bias", False)),
    )
    return ArceeDecoder(ArceeConfig(**vars(base), qk_norm=apertus))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.(?:input|attention)_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    *QK_NORM_RULES,
    (r"layers\.(\d+)\.(?:post_attention|feedforward)_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.(up|down)_proj\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"layers\.(\d+)\.mlp\.act_fn\.(alpha_p|alpha_n|eps)", r"blocks.\1.mlp.act.\2"),
    # rename() reads a name ending in .beta as an old TF LayerNorm bias: xIELU's β.
    (r"layers\.(\d+)\.mlp\.act_fn\.bias", r"blocks.\1.mlp.act.beta"),
    (r"norm\.weight", r"final_norm.weight"),
)
