"""GPT-J (EleutherAI's GPT-J-6B, the model of the knowledge-editing papers, ROME and MEMIT):
a causal decoder with one LayerNorm feeding attention and MLP in parallel, and rotary
embeddings on the first ``rotary_dim`` dims of each head, rotated in interleaved pairs.

    h = LN(x)
    x = Attn(h) + MLP(h) + x                  (one norm, a parallel residual)
    out = LN_f(x)

    RoPE (GPT-J's)  the pairs (2i, 2i + 1) of the first R = rotary_dim dims rotate by
                    position · θ^(-2i/R), θ = 10 000:
                        x'_2i   = x_2i·cos − x_2i+1·sin
                        x'_2i+1 = x_2i+1·cos + x_2i·sin
                    (Llama's rotate_half pairs (i, i + R/2) instead); dims R..D pass through
    attention       H heads of D = E/H, 1/√D, no biases on q/k/v or W^O
    MLP(x)          = fc_out · GELU_tanh(fc_in · x), with biases; no position embeddings

torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention, QKTransform
from .base import config_value
from .blocks import MLP, ParallelBlock
from .decoder import DecoderModel
from .fields import number, text

MODEL_TYPES = ("gptj",)
PREFIXES = ("transformer.",)

THETA = 10000.0


@dataclass(frozen=True)
class GPTJConfig:
    vocab_size: int
    n_embd: int
    n_layer: int
    n_head: int
    n_positions: int
    rotary_dim: int
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.rotary_dim < 2 or self.rotary_dim % 2 or self.rotary_dim > self.n_embd // self.n_head:
            raise ValueError(f"rotary_dim={self.rotary_dim} must be even and at most the head dim")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> GPTJConfig:
        embd = int(config_value(config, "n_embd", "hidden_size"))
        heads = int(config_value(config, "n_head", "num_attention_heads"))
        rotary = config.get("rotary_dim")
        return cls(
            vocab_size=int(config["vocab_size"]),
            n_embd=embd,
            n_layer=int(config_value(config, "n_layer", "num_hidden_layers")),
            n_head=heads,
            n_positions=int(config_value(config, "n_positions", "max_position_embeddings", default=2048)),
            # transformers without rotary_dim would rotate E dims of a D-dim head (and fail).
            rotary_dim=int(rotary) if rotary is not None else embd,
            n_inner=config.get("n_inner"),
            activation_function=text(config, "activation_function", "gelu_new"),
            layer_norm_epsilon=number(config, "layer_norm_epsilon", 1e-5, above=0.0),
        )


def interleaved_rotary(length: int, rotary_dim: int, like: Tensor, theta: float = THETA) -> QKTransform:
    """GPT-J's rotary q/k transform for positions 0..length-1: pairs (2i, 2i + 1) of the
    first ``rotary_dim`` dims, angles computed in float32 as transformers' sin/cos table."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64) / rotary_dim))  # (R/2,)
    angles = torch.arange(length, dtype=torch.int64).float()[:, None] * inv_freq  # (S, R/2)
    sin = angles.sin().to(device=like.device, dtype=like.dtype).repeat_interleave(2, dim=-1)  # (S, R)
    cos = angles.cos().to(device=like.device, dtype=like.dtype).repeat_interleave(2, dim=-1)  # (S, R)

    def rotate(x: Tensor) -> Tensor:
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]  # (B, H, S, R), (B, H, S, D - R)
        pairs = torch.stack((-rot[..., 1::2], rot[..., ::2]), dim=-1).flatten(-2)  # (B, H, S, R): rotate_every_two
        return torch.cat((rot * cos + pairs * sin, rest), dim=-1)

    def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return rotate(q), rotate(k)

    return apply


class GPTJDecoder(DecoderModel):
    def __init__(self, c: GPTJConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.n_layer
        self.num_heads = self.num_kv_heads = c.n_head
        self.causal = True
        self.max_positions = c.n_positions
        self.windows = [None] * c.n_layer
        self.tokens = nn.Embedding(c.vocab_size, c.n_embd)
        inner = 4 * c.n_embd if c.n_inner is None else c.n_inner
        self.blocks = nn.ModuleList(
            ParallelBlock(
                MultiHeadAttention(c.n_embd, c.n_head, bias=False),
                nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon),
                MLP(c.n_embd, inner, c.activation_function),
                None,  # ln_1 feeds the MLP too
                order="attn+mlp+x",
            )
            for _ in range(c.n_layer)
        )
        self.final_norm = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.tokens(input_ids)  # (B, S, E); positions enter through RoPE

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        return [interleaved_rotary(input_ids.size(1), self.config.rotary_dim, x)] * self.num_layers


def build(config: dict[str, Any]) -> GPTJDecoder:
    return GPTJDecoder(GPTJConfig.from_dict(config))


RULES = (
    (r"wte\.weight", r"tokens.weight"),
    (r"h\.(\d+)\.ln_1\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"h\.(\d+)\.attn\.([qkv])_proj\.weight", r"blocks.\1.attn.\2_proj.weight"),
    (r"h\.(\d+)\.attn\.out_proj\.weight", r"blocks.\1.attn.o_proj.weight"),
    (r"h\.(\d+)\.mlp\.fc_(in|out)\.(weight|bias)", r"blocks.\1.mlp.fc_\2.\3"),
    (r"ln_f\.(weight|bias)", r"final_norm.\1"),
    # Dropped: lm_head, the old attn.bias / masked_bias buffers.
)
