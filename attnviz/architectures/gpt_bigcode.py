"""GPT-BigCode (SantaCoder, StarCoder 1, WizardCoder, Octocoder): GPT-2's pre-LayerNorm
decoder with learned absolute positions and multi-query attention.

    x = x + Attn(LN_1(x));   x = x + MLP(LN_2(x));   h = LN_f(x)

    multi_query (the default)  H query heads share one key/value head (G = 1)
    otherwise                  every head its own keys and values
    attention  softmax(q·kᵀ · D^-1/2), or unscaled with scale_attn_weights false;
               biases on every projection
    MLP(x)     = c_proj · GELU_tanh(c_fc · x)

Delta against gpt2.py: nn.Linear projections (not Conv1D), and the fused ``c_attn``
laid out as transformers splits it (``convert``):
    multi_query   [W^Q (E rows) | W^K (D) | W^V (D)]
    otherwise     head by head, [q_0 k_0 v_0 | q_1 ...] of D rows each
``attention_softmax_in_fp32`` and its scaled variant change only where half-precision
rounding happens; in float32 the weights are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import MultiHeadAttention
from .base import config_value
from .blocks import MLP, split_per_head
from .decoder import DecoderModel, PreNormBlock
from .fields import number, text

MODEL_TYPES = ("gpt_bigcode",)
PREFIXES = ("transformer.",)


@dataclass(frozen=True)
class BigCodeConfig:
    vocab_size: int
    n_embd: int
    n_layer: int
    n_head: int
    n_positions: int
    multi_query: bool = True
    n_inner: int | None = None
    activation_function: str = "gelu_pytorch_tanh"
    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> BigCodeConfig:
        if config.get("add_cross_attention"):
            raise UnsupportedArchitectureError(
                "GPT-BigCode with cross-attention (add_cross_attention) is not implemented by the own engine",
                setting="add_cross_attention",
            )
        return cls(
            vocab_size=int(config["vocab_size"]),
            n_embd=int(config_value(config, "n_embd", "hidden_size")),
            n_layer=int(config_value(config, "n_layer", "num_hidden_layers")),
            n_head=int(config_value(config, "n_head", "num_attention_heads")),
            n_positions=int(config_value(config, "n_positions", "max_position_embeddings", default=1024)),
            multi_query=bool(config.get("multi_query", True)),
            n_inner=config.get("n_inner"),
            activation_function=text(config, "activation_function", "gelu_pytorch_tanh"),
            layer_norm_epsilon=number(config, "layer_norm_epsilon", 1e-5, above=0.0),
            scale_attn_weights=bool(config.get("scale_attn_weights", True)),
        )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return 1 if self.multi_query else self.n_head


class BigCodeDecoder(DecoderModel):
    def __init__(self, c: BigCodeConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.n_layer
        self.num_heads, self.num_kv_heads = c.n_head, c.kv_heads
        self.causal = True
        self.max_positions = c.n_positions
        self.windows = [None] * c.n_layer
        self.tokens = nn.Embedding(c.vocab_size, c.n_embd)
        self.positions = nn.Embedding(c.n_positions, c.n_embd)
        scale = c.head_dim**-0.5 if c.scale_attn_weights else 1.0
        self.blocks = nn.ModuleList(
            PreNormBlock(
                attn=MultiHeadAttention(c.n_embd, c.n_head, n_kv_heads=c.kv_heads, scale=scale),
                attn_norm=nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon),
                mlp=MLP(c.n_embd, 4 * c.n_embd if c.n_inner is None else c.n_inner, c.activation_function),
                mlp_norm=nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon),
            )
            for _ in range(c.n_layer)
        )
        self.final_norm = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)

    def embed(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.size(1), device=input_ids.device)  # (S,)
        return self.tokens(input_ids) + self.positions(positions)  # (B, S, E)


def build(config: dict[str, Any]) -> BigCodeDecoder:
    return BigCodeDecoder(BigCodeConfig.from_dict(config))


RULES = (
    (r"wte\.weight", r"tokens.weight"),
    (r"wpe\.weight", r"positions.weight"),
    (r"h\.(\d+)\.ln_1\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"h\.(\d+)\.attn\.c_attn\.(weight|bias)", r"blocks.\1.attn.qkv.\2"),  # split in convert()
    (r"h\.(\d+)\.attn\.c_proj\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"h\.(\d+)\.ln_2\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"h\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"blocks.\1.mlp.fc_in.\2"),
    (r"h\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"blocks.\1.mlp.fc_out.\2"),
    (r"ln_f\.(weight|bias)", r"final_norm.\1"),
    # Dropped: lm_head (tied), old attn.bias / masked_bias buffers.
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split each fused ``c_attn`` into q_proj, k_proj and v_proj (multi-query or per head)."""
    c = BigCodeConfig.from_dict(config)
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if ".attn.qkv." not in name:
            out[name] = tensor
            continue
        prefix, part = name.split(".attn.qkv.")
        if c.multi_query:
            pieces = [p.contiguous() for p in torch.split(tensor, [c.n_embd, c.head_dim, c.head_dim], dim=0)]
        else:
            pieces = split_per_head(tensor, c.n_head, c.head_dim)
        for role, piece in zip("qkv", pieces, strict=True):
            out[f"{prefix}.attn.{role}_proj.{part}"] = piece
    return out
