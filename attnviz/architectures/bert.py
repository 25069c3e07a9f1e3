"""BERT-family encoder (BERT, MiniLM, ...) built on ``attnviz.attention``.

Post-LayerNorm blocks, as in the original paper:

    x = LayerNorm(x + MultiHeadAttention(x))
    x = LayerNorm(x + W_2 · GELU(W_1 · x))

Embeddings are the sum of token, absolute position and token-type embeddings,
then a LayerNorm. torch only; reads the checkpoint's config.json and weights
without transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention, padding_mask
from ..errors import UnsupportedArchitectureError
from .base import AttnModel, ForwardOutput, activation

MODEL_TYPES = ("bert",)
PREFIXES = ("bert.",)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    position_embedding_type: str = "absolute"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        if self.position_embedding_type != "absolute":
            raise UnsupportedArchitectureError(
                f"position_embedding_type={self.position_embedding_type!r} is not implemented by --engine own",
                hint="use --engine hf",
            )

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> BertConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names and v is not None})


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.positions = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_types = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.size(1), device=input_ids.device)  # (S,)
        # A single sentence is segment 0 throughout.
        x = self.tokens(input_ids) + self.positions(positions) + self.token_types(torch.zeros_like(input_ids))
        return self.norm(x)  # (B, S, E)


class Block(nn.Module):
    """One post-LayerNorm encoder layer."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(c.hidden_size, c.num_attention_heads)
        self.attn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(c.hidden_size, c.intermediate_size)
        self.ffn_out = nn.Linear(c.intermediate_size, c.hidden_size)
        self.ffn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.act = activation(c.hidden_act)

    def forward(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        # 1. Self-attention, residual, LayerNorm.
        a, weights = self.attn(x, mask=mask)  # (B, S, E), (B, H, S, S)
        x = self.attn_norm(x + a)
        # 2. Position-wise feed-forward, residual, LayerNorm.
        x = self.ffn_norm(x + self.ffn_out(self.act(self.ffn_in(x))))
        return x, weights


class BertEncoder(AttnModel):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.num_hidden_layers
        self.num_heads = self.num_kv_heads = c.num_attention_heads
        self.causal = False
        self.max_positions = c.max_position_embeddings
        self.embed = Embeddings(c)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.num_hidden_layers))

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, max_layer: int | None = None
    ) -> ForwardOutput:
        mask = None if attention_mask is None else padding_mask(attention_mask)  # (B, 1, 1, S)
        x = self.embed(input_ids)
        attentions: list[Tensor] = []
        for block in self.blocks[: None if max_layer is None else max_layer + 1]:
            x, weights = block(x, mask)
            attentions.append(weights)
        return ForwardOutput(hidden_states=x, attentions=attentions)


def build(config: dict[str, Any]) -> BertEncoder:
    return BertEncoder(BertConfig.from_dict(config))


RULES = (
    (r"embeddings\.word_embeddings\.(\w+)", r"embed.tokens.\1"),
    (r"embeddings\.position_embeddings\.(\w+)", r"embed.positions.\1"),
    (r"embeddings\.token_type_embeddings\.(\w+)", r"embed.token_types.\1"),
    (r"embeddings\.LayerNorm\.(\w+)", r"embed.norm.\1"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.(\w+)", r"blocks.\1.attn.q_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.(\w+)", r"blocks.\1.attn.k_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.(\w+)", r"blocks.\1.attn.v_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.(\w+)", r"blocks.\1.attn.o_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(\w+)", r"blocks.\1.attn_norm.\2"),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.(\w+)", r"blocks.\1.ffn_in.\2"),
    (r"encoder\.layer\.(\d+)\.output\.dense\.(\w+)", r"blocks.\1.ffn_out.\2"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(\w+)", r"blocks.\1.ffn_norm.\2"),
)
