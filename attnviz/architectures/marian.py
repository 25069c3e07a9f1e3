"""Marian (the opus-mt translation models) and Pegasus: BART's encoder-decoder stacks
(bart.py, seq2seq.py) over fixed sinusoidal positions.

Deltas from bart.py:

    embeddings  x = E[ids] · embed_scale + P[0..S-1]     no offset, no embedding LayerNorm
                embed_scale = √d_model with ``scale_embedding`` (both families' default)
    P           the sinusoidal table of Vaswani et al. 2017 (§3.5), halves not interleaved:
                    P[pos, j]          = sin(pos / 10000^(2j/E))       j < E/2
                    P[pos, E/2 + j]    = cos(pos / 10000^(2j/E))
                computed in float64 as transformers' ``create_weight`` does, then float32;
                ``max_position_embeddings`` rows (a checkpoint's own table, if it holds
                one, Pegasus's do, is read instead)
    marian      post-norm blocks (BART's); ``share_encoder_decoder_embeddings`` false
                gives the decoder its own token table (``decoder_vocab_size`` rows)
    pegasus     pre-norm blocks with a final LayerNorm on each stack (mBART's)

torch + numpy only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from .bart import RULES as BART_RULES
from .bart import BartConfig, _stack
from .fields import text, whole
from .seq2seq import EncoderDecoder

MODEL_TYPES = ("marian", "pegasus")
PREFIXES = ("model.",)


def sinusoidal_table(rows: int, dim: int) -> Tensor:
    """(rows, dim) float32: sin in the first half of each row, cos in the second (see above)."""
    import numpy as np

    # The same float64 numbers as transformers' loop pos / np.power(10000, 2 * (j // 2) / dim).
    exponents = np.array([2 * (j // 2) / dim for j in range(dim)])  # (dim,)
    scales = np.array([np.power(10000, e) for e in exponents])  # (dim,)
    angles = np.arange(rows, dtype=np.float64)[:, None] / scales[None, :]  # (rows, dim)
    out = torch.empty(rows, dim, dtype=torch.float32)
    half = dim // 2 if dim % 2 == 0 else dim // 2 + 1
    out[:, :half] = torch.tensor(np.sin(angles[:, 0::2]), dtype=torch.float32)
    out[:, half:] = torch.tensor(np.cos(angles[:, 1::2]), dtype=torch.float32)
    return out


class SinusoidalSeq2Seq(EncoderDecoder):
    def __init__(self, c: BartConfig, decoder_vocab: int | None) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.encoder_layers
        self.num_heads = self.num_kv_heads = c.encoder_attention_heads
        self.decoder_layers = c.decoder_layers
        self.decoder_heads = c.decoder_attention_heads
        self.causal = False
        self.max_positions = c.max_position_embeddings
        self.embed_scale = c.d_model**0.5 if c.scale_embedding else 1.0
        self.tokens = nn.Embedding(c.vocab_size, c.d_model)
        # Marian without shared embeddings: the decoder reads its own vocabulary.
        self.decoder_tokens = nn.Embedding(decoder_vocab, c.d_model) if decoder_vocab is not None else None
        self.encoder_positions = nn.Embedding(c.max_position_embeddings, c.d_model)
        self.decoder_positions = nn.Embedding(c.max_position_embeddings, c.d_model)
        self.encoder = _stack(c, decoder=False)
        self.decoder = _stack(c, decoder=True)

    def embed(self, input_ids: Tensor, part: str) -> Tensor:
        decoder = part != "encoder"
        tokens = self.decoder_tokens if decoder and self.decoder_tokens is not None else self.tokens
        positions = self.decoder_positions if decoder else self.encoder_positions
        # 1. Tokens, scaled; 2. plus the fixed positions 0..S-1.
        x = tokens(input_ids) * self.embed_scale  # (B, S, E)
        return x + positions(torch.arange(input_ids.size(1), device=input_ids.device))  # (B, S, E)


def build(config: dict[str, Any]) -> SinusoidalSeq2Seq:
    model_type = config.get("model_type", "marian")
    c = dataclasses.replace(
        BartConfig.from_dict(config),
        scale_embedding=bool(config.get("scale_embedding", True)),
        activation_function=text(config, "activation_function", "swish" if model_type == "marian" else "gelu"),
        pre_norm=model_type == "pegasus",
    )
    shared = model_type == "pegasus" or bool(config.get("share_encoder_decoder_embeddings", True))
    decoder_vocab = None if shared else whole(config, "decoder_vocab_size", c.vocab_size)
    return SinusoidalSeq2Seq(c, decoder_vocab)


RULES = (
    (r"decoder\.embed_tokens\.weight", r"decoder_tokens.weight"),  # kept only when not shared (convert)
    (r"(encoder|decoder)\.embed_positions\.weight", r"\1_positions.weight"),
    *BART_RULES,
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """The sinusoidal tables where the checkpoint holds none (Marian never saves them);
    a shared decoder token table is the encoder's."""
    out = dict(tensors)
    model_type = config.get("model_type", "marian")
    shared = model_type == "pegasus" or bool(config.get("share_encoder_decoder_embeddings", True))
    if shared:
        decoder = out.pop("decoder_tokens.weight", None)
        if "tokens.weight" not in out and decoder is not None:
            out["tokens.weight"] = decoder
    rows, dim = int(config["max_position_embeddings"]), int(config["d_model"])
    for part in ("encoder", "decoder"):
        if f"{part}_positions.weight" not in out:
            out[f"{part}_positions.weight"] = sinusoidal_table(rows, dim)
    return out
