"""T5 and mT5: a pre-norm encoder-decoder with relative position buckets.

Where T5 departs from the textbook transformer:
    no √d scaling   scores are q·kᵀ, unscaled (the 1/√d is folded into the
                    initialisation of W^Q)
    position bias   no position embeddings at all: a learned scalar per head and
                    relative-position bucket is added to every self-attention score.
                    Layer 0 of each stack holds the table; every layer of that stack
                    reuses it. Buckets: exact distances below ``num_buckets/4`` (encoder,
                    both directions) or ``num_buckets/2`` (decoder, past only), then
                    log-spaced up to ``relative_attention_max_distance``.
                    Cross-attention has no position bias.
    RMSNorm         T5LayerNorm: x / √(mean(x²) + eps) · w, no mean, no bias, in float32
    no biases       on any projection
    MLP             relu (``feed_forward_proj="relu"``, T5 1.0) or gated
                    (``"gated-gelu"``: gelu_new(W_0·x) ⊙ W_1·x, T5 1.1, mT5, Flan-T5)

Tokens are embedded by one table shared by encoder and decoder, unscaled.
torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import MultiHeadAttention
from .base import activation, config_value
from .llama import RMSNorm
from .seq2seq import EncoderDecoder, Seq2SeqBlock, Stack

MODEL_TYPES = ("t5", "mt5")
PREFIXES = ()


@dataclass(frozen=True)
class T5Config:
    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    act: str = "relu"
    gated: bool = False

    def __post_init__(self) -> None:
        if self.relative_attention_num_buckets < 4:
            raise ValueError(f"relative_attention_num_buckets={self.relative_attention_num_buckets} is below 4")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> T5Config:
        # "relu", "gelu", "gated-gelu", "gated-silu": as transformers' T5Config parses it.
        proj = str(config.get("feed_forward_proj", "relu"))
        parts = proj.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise UnsupportedArchitectureError(f"feed_forward_proj={proj!r} is not implemented by the own engine")
        act = "gelu_new" if proj == "gated-gelu" else parts[-1]
        activation(act)  # an unknown activation fails here, naming it
        layers = int(config["num_layers"])
        return cls(
            vocab_size=int(config["vocab_size"]),
            d_model=int(config["d_model"]),
            d_kv=int(config["d_kv"]),
            d_ff=int(config["d_ff"]),
            num_layers=layers,
            num_decoder_layers=int(config_value(config, "num_decoder_layers", default=layers)),
            num_heads=int(config["num_heads"]),
            relative_attention_num_buckets=int(config_value(config, "relative_attention_num_buckets", default=32)),
            relative_attention_max_distance=int(config_value(config, "relative_attention_max_distance", default=128)),
            layer_norm_epsilon=float(config_value(config, "layer_norm_epsilon", default=1e-6)),
            act=act,
            gated=len(parts) == 2,
        )


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """Bucket of each (key - query) distance, as Mesh TensorFlow's T5 defines it.

    Bidirectional (encoder): half the buckets for keys after the query, half for keys
    before. Causal (decoder): all buckets for keys at or before the query. Within a
    direction, distances below half the buckets have their own bucket; larger ones share
    log-spaced buckets, and every distance from ``max_distance`` on shares the last.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.min(relative_position, torch.zeros_like(relative_position))
    exact = num_buckets // 2
    # Same float ops in the same order as transformers, so the buckets agree at the edges.
    large = (
        exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)).long()
    )
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(distance < exact, distance, large)


class DenseMLP(nn.Module):
    """T5 1.0: W_o · act(W_i · x)."""

    def __init__(self, c: T5Config) -> None:
        super().__init__()
        self.wi = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.wo = nn.Linear(c.d_ff, c.d_model, bias=False)
        self.act = activation(c.act)

    def forward(self, x: Tensor) -> Tensor:
        return self.wo(self.act(self.wi(x)))


class GatedMLP(nn.Module):
    """T5 1.1 / mT5: W_o · (act(W_0 · x) ⊙ W_1 · x)."""

    def __init__(self, c: T5Config) -> None:
        super().__init__()
        self.wi_0 = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.wi_1 = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.wo = nn.Linear(c.d_ff, c.d_model, bias=False)
        self.act = activation(c.act)

    def forward(self, x: Tensor) -> Tensor:
        return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))


def _attention(c: T5Config) -> MultiHeadAttention:
    # scale=1.0: T5 does not divide the scores by √d.
    return MultiHeadAttention(c.d_model, c.num_heads, head_dim=c.d_kv, bias=False, scale=1.0)


def _block(c: T5Config, decoder: bool) -> Seq2SeqBlock:
    return Seq2SeqBlock(
        attn=_attention(c),
        attn_norm=RMSNorm(c.d_model, c.layer_norm_epsilon),
        mlp=GatedMLP(c) if c.gated else DenseMLP(c),
        mlp_norm=RMSNorm(c.d_model, c.layer_norm_epsilon),
        pre_norm=True,
        cross=_attention(c) if decoder else None,
        cross_norm=RMSNorm(c.d_model, c.layer_norm_epsilon) if decoder else None,
    )


class T5(EncoderDecoder):
    def __init__(self, c: T5Config) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.num_layers
        self.num_heads = self.num_kv_heads = c.num_heads
        self.decoder_layers = c.num_decoder_layers
        self.decoder_heads = c.num_heads
        self.causal = False
        self.max_positions = None  # relative positions: no table to run out of
        self.tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.encoder = Stack(
            [_block(c, False) for _ in range(c.num_layers)], RMSNorm(c.d_model, c.layer_norm_epsilon), False
        )
        self.decoder = Stack(
            [_block(c, True) for _ in range(c.num_decoder_layers)], RMSNorm(c.d_model, c.layer_norm_epsilon), True
        )
        # One (bucket -> per-head bias) table per stack, read by all of its layers.
        self.encoder_bias = nn.Embedding(c.relative_attention_num_buckets, c.num_heads)
        self.decoder_bias = nn.Embedding(c.relative_attention_num_buckets, c.num_heads)

    def embed(self, input_ids: Tensor, part: str) -> Tensor:
        return self.tokens(input_ids)  # (B, S, E); no scaling, no positions

    def position_bias(self, part: str, length: int, like: Tensor) -> Tensor:
        # 1. Distance of every key from every query: key position - query position.
        positions = torch.arange(length, dtype=torch.long, device=like.device)
        relative = positions[None, :] - positions[:, None]  # (L, L)
        # 2. Its bucket, then the bucket's learned bias for each head.
        buckets = relative_position_bucket(
            relative,
            bidirectional=part == "encoder",
            num_buckets=self.config.relative_attention_num_buckets,
            max_distance=self.config.relative_attention_max_distance,
        )  # (L, L)
        table = self.encoder_bias if part == "encoder" else self.decoder_bias
        return table(buckets).permute(2, 0, 1)[None]  # (1, H, L, L)


def build(config: dict[str, Any]) -> T5:
    return T5(T5Config.from_dict(config))


RULES = (
    # The shared table; the stacks' embed_tokens are tied to it (older checkpoints save them too).
    (r"shared\.weight", r"tokens.weight"),
    (r"(?:encoder|decoder)\.embed_tokens\.weight", r"tokens.weight"),
    (r"(encoder|decoder)\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\.weight", r"\1_bias.weight"),
    (
        r"(encoder|decoder)\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.weight",
        r"\1.blocks.\2.attn.\3_proj.weight",
    ),
    (r"(encoder|decoder)\.block\.(\d+)\.layer\.0\.layer_norm\.weight", r"\1.blocks.\2.attn_norm.weight"),
    (r"decoder\.block\.(\d+)\.layer\.1\.EncDecAttention\.([qkvo])\.weight", r"decoder.blocks.\1.cross.\2_proj.weight"),
    (r"decoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight", r"decoder.blocks.\1.cross_norm.weight"),
    # The MLP is sub-layer 1 in the encoder, 2 in the decoder (after cross-attention).
    (r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.(wi|wi_0|wi_1|wo)\.weight", r"encoder.blocks.\1.mlp.\2.weight"),
    (r"encoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight", r"encoder.blocks.\1.mlp_norm.weight"),
    (r"decoder\.block\.(\d+)\.layer\.2\.DenseReluDense\.(wi|wi_0|wi_1|wo)\.weight", r"decoder.blocks.\1.mlp.\2.weight"),
    (r"decoder\.block\.(\d+)\.layer\.2\.layer_norm\.weight", r"decoder.blocks.\1.mlp_norm.weight"),
    (r"(encoder|decoder)\.final_layer_norm\.weight", r"\1.final_norm.weight"),
    # lm_head is dropped: we stop at the decoder's final norm.
)
