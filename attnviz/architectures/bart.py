"""BART and mBART: encoder-decoders with learned absolute positions.

    embeddings   tokens · embed_scale (√d_model with ``scale_embedding``, else 1)
                 + learned positions, read at position + 2 (BART's offset: the table
                 has max_position_embeddings + 2 rows), then a LayerNorm
                 (``layernorm_embedding``)
    bart         post-norm blocks, as in the original transformer:
                 x = LayerNorm(x + f(x)) after self-attention, cross-attention and MLP
    mbart        pre-norm blocks, x = x + f(LayerNorm(x)), and a final LayerNorm on
                 each stack's output
    attention    softmax(q·kᵀ/√d) with biases on every projection
    MLP          fc2 · act(fc1 · x), ``activation_function`` (gelu by default)

torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from .base import activation, config_value
from .seq2seq import EncoderDecoder, Seq2SeqBlock, Stack

MODEL_TYPES = ("bart", "mbart")
PREFIXES = ("model.",)

POSITION_OFFSET = 2  # BART's learned positions start at row 2 of the table


@dataclass(frozen=True)
class BartConfig:
    vocab_size: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    max_position_embeddings: int
    activation_function: str = "gelu"
    scale_embedding: bool = False
    pre_norm: bool = False  # mBART

    def __post_init__(self) -> None:
        for heads in (self.encoder_attention_heads, self.decoder_attention_heads):
            if self.d_model % heads:
                raise ValueError(f"d_model={self.d_model} is not divisible by {heads} attention heads")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> BartConfig:
        return cls(
            vocab_size=int(config["vocab_size"]),
            d_model=int(config["d_model"]),
            encoder_layers=int(config["encoder_layers"]),
            decoder_layers=int(config["decoder_layers"]),
            encoder_attention_heads=int(config["encoder_attention_heads"]),
            decoder_attention_heads=int(config["decoder_attention_heads"]),
            encoder_ffn_dim=int(config["encoder_ffn_dim"]),
            decoder_ffn_dim=int(config["decoder_ffn_dim"]),
            max_position_embeddings=int(config["max_position_embeddings"]),
            activation_function=str(config_value(config, "activation_function", default="gelu")),
            scale_embedding=bool(config.get("scale_embedding", False)),
            pre_norm=config.get("model_type") == "mbart",
        )


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, act: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.act = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _stack(c: BartConfig, decoder: bool) -> Stack:
    heads = c.decoder_attention_heads if decoder else c.encoder_attention_heads
    d_ff = c.decoder_ffn_dim if decoder else c.encoder_ffn_dim
    head_dim = c.d_model // heads

    def attention() -> MultiHeadAttention:
        # head_dim**-0.5, exactly as transformers computes it, so the scores round alike.
        return MultiHeadAttention(c.d_model, heads, scale=head_dim**-0.5)

    blocks = [
        Seq2SeqBlock(
            attn=attention(),
            attn_norm=nn.LayerNorm(c.d_model),
            mlp=FeedForward(c.d_model, d_ff, c.activation_function),
            mlp_norm=nn.LayerNorm(c.d_model),
            pre_norm=c.pre_norm,
            cross=attention() if decoder else None,
            cross_norm=nn.LayerNorm(c.d_model) if decoder else None,
        )
        for _ in range(c.decoder_layers if decoder else c.encoder_layers)
    ]
    return Stack(blocks, nn.LayerNorm(c.d_model) if c.pre_norm else None, causal=decoder)


class Bart(EncoderDecoder):
    def __init__(self, c: BartConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.encoder_layers
        self.num_heads = self.num_kv_heads = c.encoder_attention_heads
        self.decoder_layers = c.decoder_layers
        self.decoder_heads = c.decoder_attention_heads
        self.causal = False
        self.max_positions = c.max_position_embeddings
        self.embed_scale = math.sqrt(c.d_model) if c.scale_embedding else 1.0
        self.tokens = nn.Embedding(c.vocab_size, c.d_model)
        rows = c.max_position_embeddings + POSITION_OFFSET
        self.encoder_positions = nn.Embedding(rows, c.d_model)
        self.decoder_positions = nn.Embedding(rows, c.d_model)
        self.encoder_embed_norm = nn.LayerNorm(c.d_model)
        self.decoder_embed_norm = nn.LayerNorm(c.d_model)
        self.encoder = _stack(c, decoder=False)
        self.decoder = _stack(c, decoder=True)

    def embed(self, input_ids: Tensor, part: str) -> Tensor:
        import torch

        positions = self.encoder_positions if part == "encoder" else self.decoder_positions
        norm = self.encoder_embed_norm if part == "encoder" else self.decoder_embed_norm
        # 1. Tokens, scaled; 2. plus positions 0..S-1 read at rows 2..S+1; 3. LayerNorm.
        x = self.tokens(input_ids) * self.embed_scale  # (B, S, E)
        rows = torch.arange(input_ids.size(1), device=input_ids.device) + POSITION_OFFSET  # (S,)
        return norm(x + positions(rows))  # (B, S, E)


def build(config: dict[str, Any]) -> Bart:
    return Bart(BartConfig.from_dict(config))


RULES = (
    (r"shared\.weight", r"tokens.weight"),
    (r"(?:encoder|decoder)\.embed_tokens\.weight", r"tokens.weight"),
    (r"(encoder|decoder)\.embed_positions\.weight", r"\1_positions.weight"),
    (r"(encoder|decoder)\.layernorm_embedding\.(weight|bias)", r"\1_embed_norm.\2"),
    (r"(encoder|decoder)\.layer_norm\.(weight|bias)", r"\1.final_norm.\2"),  # mBART
    (r"(encoder|decoder)\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)", r"\1.blocks.\2.attn.\3_proj.\4"),
    (r"(encoder|decoder)\.layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)", r"\1.blocks.\2.attn.o_proj.\3"),
    (r"(encoder|decoder)\.layers\.(\d+)\.self_attn_layer_norm\.(weight|bias)", r"\1.blocks.\2.attn_norm.\3"),
    (r"decoder\.layers\.(\d+)\.encoder_attn\.([qkv])_proj\.(weight|bias)", r"decoder.blocks.\1.cross.\2_proj.\3"),
    (r"decoder\.layers\.(\d+)\.encoder_attn\.out_proj\.(weight|bias)", r"decoder.blocks.\1.cross.o_proj.\2"),
    (r"decoder\.layers\.(\d+)\.encoder_attn_layer_norm\.(weight|bias)", r"decoder.blocks.\1.cross_norm.\2"),
    (r"(encoder|decoder)\.layers\.(\d+)\.(fc1|fc2)\.(weight|bias)", r"\1.blocks.\2.mlp.\3.\4"),
    (r"(encoder|decoder)\.layers\.(\d+)\.final_layer_norm\.(weight|bias)", r"\1.blocks.\2.mlp_norm.\3"),
    # final_logits_bias and lm_head are dropped: we stop at the decoder's output.
)
