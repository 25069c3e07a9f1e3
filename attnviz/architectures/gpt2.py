"""GPT-2: a causal pre-LayerNorm decoder with learned absolute positions.

Checkpoint quirks handled in ``convert``:
* its projections are ``Conv1D`` modules, which store the weight as (in, out),
  the transpose of ``nn.Linear``'s (out, in);
* ``c_attn`` is W^Q, W^K and W^V fused into one (E, 3E) matrix, split here into
  our per-role projections.
Scaling options: ``scale_attn_weights`` (1/√D, or none) and
``scale_attn_by_inverse_layer_idx`` (a further 1/(layer+1)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import MultiHeadAttention
from .base import activation, config_value
from .decoder import DecoderModel, PreNormBlock

MODEL_TYPES = ("gpt2",)
PREFIXES = ("transformer.",)


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # None: 4 * n_embd
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> GPT2Config:
        if config.get("add_cross_attention"):
            raise UnsupportedArchitectureError(
                "GPT-2 with cross-attention (add_cross_attention) is not implemented by the own engine"
            )
        # reorder_and_upcast_attn only changes the order of q·kᵀ and the scale and
        # computes them in float32: the same math, so in float32 the same weights.
        return cls(
            vocab_size=config_value(config, "vocab_size", default=cls.vocab_size),
            n_positions=config_value(config, "n_positions", "max_position_embeddings", default=cls.n_positions),
            n_embd=config_value(config, "n_embd", "hidden_size", default=cls.n_embd),
            n_layer=config_value(config, "n_layer", "num_hidden_layers", default=cls.n_layer),
            n_head=config_value(config, "n_head", "num_attention_heads", default=cls.n_head),
            n_inner=config.get("n_inner"),
            activation_function=config_value(config, "activation_function", default=cls.activation_function),
            layer_norm_epsilon=config_value(config, "layer_norm_epsilon", default=cls.layer_norm_epsilon),
            scale_attn_weights=config_value(config, "scale_attn_weights", default=True),
            scale_attn_by_inverse_layer_idx=config_value(config, "scale_attn_by_inverse_layer_idx", default=False),
        )

    def scale(self, layer: int) -> float:
        """The factor on q·kᵀ in ``layer`` (0-based), computed as transformers does."""
        scale = (self.n_embd // self.n_head) ** -0.5 if self.scale_attn_weights else 1.0
        if self.scale_attn_by_inverse_layer_idx:
            scale /= float(layer + 1)
        return scale


class MLP(nn.Module):
    def __init__(self, c: GPT2Config) -> None:
        super().__init__()
        inner = 4 * c.n_embd if c.n_inner is None else c.n_inner
        self.fc_in = nn.Linear(c.n_embd, inner)
        self.fc_out = nn.Linear(inner, c.n_embd)
        self.act = activation(c.activation_function)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc_out(self.act(self.fc_in(x)))


class GPT2Decoder(DecoderModel):
    def __init__(self, c: GPT2Config) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.n_layer
        self.num_heads = self.num_kv_heads = c.n_head
        self.causal = True
        self.max_positions = c.n_positions
        self.windows = [None] * c.n_layer
        self.tokens = nn.Embedding(c.vocab_size, c.n_embd)
        self.positions = nn.Embedding(c.n_positions, c.n_embd)
        self.blocks = nn.ModuleList(
            PreNormBlock(
                attn=MultiHeadAttention(c.n_embd, c.n_head, scale=c.scale(layer)),
                attn_norm=nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon),
                mlp=MLP(c),
                mlp_norm=nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon),
            )
            for layer in range(c.n_layer)
        )
        self.final_norm = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)

    def embed(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.size(1), device=input_ids.device)  # (S,)
        return self.tokens(input_ids) + self.positions(positions)  # (B, S, E)


def build(config: dict[str, Any]) -> GPT2Decoder:
    return GPT2Decoder(GPT2Config.from_dict(config))


RULES = (
    (r"wte\.weight", r"tokens.weight"),
    (r"wpe\.weight", r"positions.weight"),
    (r"h\.(\d+)\.ln_1\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"h\.(\d+)\.attn\.c_attn\.(weight|bias)", r"blocks.\1.attn.c_attn.\2"),  # split in convert()
    (r"h\.(\d+)\.attn\.c_proj\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"h\.(\d+)\.ln_2\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"h\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"blocks.\1.mlp.fc_in.\2"),
    (r"h\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"blocks.\1.mlp.fc_out.\2"),
    (r"ln_f\.(weight|bias)", r"final_norm.\1"),
    # Not matched, so dropped: h.N.attn.bias / masked_bias (old causal-mask buffers), lm_head.
)

_CONV1D = (".attn.o_proj.weight", ".mlp.fc_in.weight", ".mlp.fc_out.weight")


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Conv1D (in, out) weights -> nn.Linear (out, in); split the fused c_attn into q/k/v."""
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(".attn.c_attn.weight"):
            prefix = name.removesuffix("c_attn.weight")
            # (E, 3E) -> (3E, E): rows [0, E) are W^Q, [E, 2E) W^K, [2E, 3E) W^V.
            for role, part in zip("qkv", tensor.t().chunk(3, dim=0), strict=True):
                out[f"{prefix}{role}_proj.weight"] = part.contiguous()  # (E, E)
        elif name.endswith(".attn.c_attn.bias"):
            prefix = name.removesuffix("c_attn.bias")
            for role, part in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                out[f"{prefix}{role}_proj.bias"] = part.contiguous()  # (E,)
        elif name.endswith(_CONV1D):
            out[name] = tensor.t().contiguous()
        else:
            out[name] = tensor
    return out
