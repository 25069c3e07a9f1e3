"""GPT-Neo (EleutherAI's GPT-Neo 125M-2.7B, the TinyStories models): GPT-2's pre-LayerNorm
decoder with learned absolute positions, and two differences in its attention.

    x = x + Attn_l(LN_1(x))
    x = x + MLP(LN_2(x))          MLP(x) = W_proj · GELU_tanh(W_fc · x)
    h = LN_f(x)

    Attn_l   softmax(q·kᵀ) · v with NO 1/√D scaling (the scores are q·kᵀ as they are)
    layers   ``attention_layers`` alternate "global" (full causal) and "local": query i
             sees keys i - window_size < j <= i only (window_size 256 in the released
             models; transformers' bias buffer tril XOR tril(-window_size))

Delta against gpt2.py: nn.Linear projections (not Conv1D), q/k/v without biases and
W^O with one, ``intermediate_size`` (None: 4E). Older configs give the layer pattern as
``attention_types`` [[["global", "local"], 12]] (a pattern and its repeat count), as
transformers expands it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import MultiHeadAttention
from .base import config_value
from .blocks import MLP
from .decoder import DecoderModel, PreNormBlock
from .fields import number, sequence, text, whole

MODEL_TYPES = ("gpt_neo",)
PREFIXES = ("transformer.",)


def attention_layers(config: dict[str, Any]) -> tuple[str, ...]:
    """Per layer "global" or "local", from ``attention_layers`` or ``attention_types``."""
    layers = config.get("attention_layers")
    if not layers:
        layers = [
            kind
            for pattern, repeat in sequence(config, "attention_types", [])
            for _ in range(repeat)
            for kind in pattern
        ]
    return tuple(str(kind) for kind in layers)


@dataclass(frozen=True)
class GPTNeoConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    max_position_embeddings: int
    layer_kinds: tuple[str, ...]
    window_size: int = 256
    intermediate_size: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if len(self.layer_kinds) != self.num_layers:
            raise ValueError(f"attention_layers names {len(self.layer_kinds)} layers, num_layers is {self.num_layers}")
        unknown = sorted(set(self.layer_kinds) - {"global", "local"})
        if unknown:
            raise UnsupportedArchitectureError(
                f"GPT-Neo attention layer types {', '.join(map(repr, unknown))} are not implemented by the own engine",
                setting="attention_layers",
            )
        if "local" in self.layer_kinds and self.window_size < 1:
            raise ValueError(f"window_size={self.window_size} must be at least 1")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> GPTNeoConfig:
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config_value(config, "num_layers", "num_hidden_layers")),
            num_heads=int(config_value(config, "num_heads", "num_attention_heads")),
            max_position_embeddings=whole(config, "max_position_embeddings", 2048),
            layer_kinds=attention_layers(config),
            window_size=whole(config, "window_size", 256),
            intermediate_size=whole(config, "intermediate_size", 4 * int(config["hidden_size"])),
            activation_function=text(config, "activation_function", "gelu_new"),
            layer_norm_epsilon=number(config, "layer_norm_epsilon", 1e-5, above=0.0),
        )


class GPTNeoDecoder(DecoderModel):
    def __init__(self, c: GPTNeoConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.num_layers
        self.num_heads = self.num_kv_heads = c.num_heads
        self.causal = True
        self.max_positions = c.max_position_embeddings
        self.windows = [c.window_size if kind == "local" else None for kind in c.layer_kinds]
        self.tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.positions = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        inner = 4 * c.hidden_size if c.intermediate_size is None else c.intermediate_size
        self.blocks = nn.ModuleList(
            PreNormBlock(
                # scale 1.0: GPT-Neo never divides q·kᵀ by √D.
                attn=MultiHeadAttention(c.hidden_size, c.num_heads, bias=False, out_bias=True, scale=1.0),
                attn_norm=nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon),
                mlp=MLP(c.hidden_size, inner, c.activation_function),
                mlp_norm=nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon),
            )
            for _ in range(c.num_layers)
        )
        self.final_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon)

    def embed(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.size(1), device=input_ids.device)  # (S,)
        return self.tokens(input_ids) + self.positions(positions)  # (B, S, E)


def build(config: dict[str, Any]) -> GPTNeoDecoder:
    return GPTNeoDecoder(GPTNeoConfig.from_dict(config))


RULES = (
    (r"wte\.weight", r"tokens.weight"),
    (r"wpe\.weight", r"positions.weight"),
    (r"h\.(\d+)\.ln_1\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"h\.(\d+)\.attn\.attention\.([qkv])_proj\.weight", r"blocks.\1.attn.\2_proj.weight"),
    (r"h\.(\d+)\.attn\.attention\.out_proj\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"h\.(\d+)\.ln_2\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"h\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"blocks.\1.mlp.fc_in.\2"),
    (r"h\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"blocks.\1.mlp.fc_out.\2"),
    (r"ln_f\.(weight|bias)", r"final_norm.\1"),
    # Dropped: the attention bias / masked_bias buffers of old checkpoints, lm_head.
)
