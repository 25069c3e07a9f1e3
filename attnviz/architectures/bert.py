"""BERT-family encoder (BERT, MiniLM, ...) built on ``attnviz.nn.attention``, and the
pieces every BERT-like family reuses (RoBERTa, XLM-R, DistilBERT, ALBERT, ELECTRA).

Post-LayerNorm blocks, as in the original paper:

    x = LayerNorm(x + MultiHeadAttention(x))
    x = LayerNorm(x + W_2 · GELU(W_1 · x))

Embeddings are the sum of token, token-type and absolute position embeddings,
then a LayerNorm. The families differ only at the edges, and each difference is
one switch here:

    embedding_size  ALBERT/ELECTRA embed narrower than the blocks, then project up
    type_vocab_size 0 for DistilBERT, which has no token types
    position_ids()  RoBERTa counts positions from past its padding index
    block_index()   ALBERT runs one shared block for every layer
    position_bias() MPNet adds relative-position buckets to every layer's scores

torch only; reads the checkpoint's config.json and weights without transformers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import Mask, MultiHeadAttention
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from .base import AttnModel, ForwardOutput, activation, layer_loop

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
    type_vocab_size: int = 2  # 0: no token-type embeddings (DistilBERT)
    layer_norm_eps: float = 1e-12
    position_embedding_type: str = "absolute"
    embedding_size: int | None = None  # None: embeddings are hidden_size wide
    pad_token_id: int | None = None
    is_decoder: bool = False
    add_cross_attention: bool = False

    def __post_init__(self) -> None:
        if self.embedding_size is not None and (
            isinstance(self.embedding_size, bool) or not isinstance(self.embedding_size, int) or self.embedding_size < 1
        ):
            # 0 read as "unset" gave hidden-wide embeddings where transformers builds 0-wide ones (issue 38).
            raise ValueError(f"embedding_size is {self.embedding_size!r}; it must be a whole number of at least 1")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        if self.position_embedding_type != "absolute":
            raise UnsupportedArchitectureError(
                f"position_embedding_type={self.position_embedding_type!r} is not implemented by the own engine"
            )
        # A BERT-like stack saved as a decoder (RobertaForCausalLM, ...) masks the future
        # and may cross-attend; we implement only the encoder.
        if self.is_decoder or self.add_cross_attention:
            raise UnsupportedArchitectureError(
                "this BERT-like checkpoint is configured as a decoder (is_decoder/add_cross_attention), "
                "which the own engine does not implement"
            )

    @property
    def embedding_width(self) -> int:
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    @classmethod
    def from_dict(cls, config: dict[str, Any], **overrides: Any) -> BertConfig:
        """Keep the config.json keys we know; ``overrides`` win (families that name things differently)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in config.items() if k in names and v is not None}
        return cls(**{**values, **overrides})


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        width = c.embedding_width
        self.tokens = nn.Embedding(c.vocab_size, width)
        self.positions = nn.Embedding(c.max_position_embeddings, width)
        self.token_types = nn.Embedding(c.type_vocab_size, width) if c.type_vocab_size else None
        self.norm = nn.LayerNorm(width, eps=c.layer_norm_eps)

    def position_ids(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, S) or broadcastable: absolute positions 0..S-1 (padding sits at the end,
        so real tokens keep their positions)."""
        return torch.arange(input_ids.size(1), device=input_ids.device)  # (S,)

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> Tensor:
        """input_ids (B, S); token_type_ids (B, S), the segment of each token (0 = sentence A,
        1 = sentence B of a pair); None = a single sentence, segment 0 throughout;
        attention_mask (B, S) of 1/0, for position schemes that skip padding (RoBERTa)."""
        x = self.tokens(input_ids)  # (B, S, E)
        if self.token_types is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids  # (B, S)
            x = x + self.token_types(types)
        # Summed in transformers' order (tokens, types, positions) so rounding matches too.
        x = x + self.positions(self.position_ids(input_ids, attention_mask))
        return self.norm(x)  # (B, S, E)


class Block(nn.Module):
    """One post-LayerNorm encoder layer."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        # head_dim**-0.5, exactly as transformers computes it, so the scores round alike.
        head_dim = c.hidden_size // c.num_attention_heads
        self.attn = MultiHeadAttention(c.hidden_size, c.num_attention_heads, scale=head_dim**-0.5)
        self.attn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(c.hidden_size, c.intermediate_size)
        self.ffn_out = nn.Linear(c.intermediate_size, c.hidden_size)
        self.ffn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.act = activation(c.hidden_act)

    def forward(
        self, x: Tensor, mask: Mask | None, request: RowRequest = EAGER, score_bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        # 1. Self-attention (with the family's position bias, if any), residual, LayerNorm.
        a, weights = self.attn(x, mask=mask, request=request, score_bias=score_bias)  # (B, S, E), (B, H, R, S)
        x = self.attn_norm(x + tap("attn_out", a))
        # 2. Position-wise feed-forward, residual, LayerNorm.
        x = self.ffn_norm(x + tap("mlp_out", self.ffn_out(self.act(self.ffn_in(x)))))
        return x, weights


class BertEncoder(AttnModel):
    """Embeddings, an optional projection up to ``hidden_size``, and post-LN blocks.

    Args:
        c: the config.
        embed: the embedding module (default: ``Embeddings(c)``).
        project: put a Linear(embedding_size -> hidden_size) after the embeddings.
        num_blocks: how many distinct blocks hold weights (default: one per layer).
    """

    def __init__(
        self, c: BertConfig, embed: Embeddings | None = None, project: bool = False, num_blocks: int | None = None
    ) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.num_hidden_layers
        self.num_heads = self.num_kv_heads = c.num_attention_heads
        self.causal = False
        self.max_positions = c.max_position_embeddings
        self.embed = embed if embed is not None else Embeddings(c)
        self.project = nn.Linear(c.embedding_width, c.hidden_size) if project else None
        self.blocks = nn.ModuleList(Block(c) for _ in range(num_blocks or c.num_hidden_layers))
        # Sentence pairs: the segments this model tells apart (0: no token types, DistilBERT).
        self.type_vocab_size = c.type_vocab_size

    def block_index(self, layer: int) -> int:
        """Which of ``self.blocks`` computes layer ``layer``."""
        return layer

    def position_bias(self, length: int, like: Tensor) -> Tensor | None:
        """(1, H, S, S) bias added to the attention scores of every layer (MPNet's relative
        position buckets); None here."""
        return None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_layer: int | None = None,
        token_type_ids: Tensor | None = None,
        *,
        layers: Collection[int] | None = None,
        queries: Sequence[int] | None = None,
        fused: bool = True,
    ) -> ForwardOutput:
        """As ``AttnModel.forward``, plus token_type_ids (B, S): the segments of a sentence pair."""
        # 1. Embeddings (and the projection up to the blocks' width, if any).
        mask = None if attention_mask is None else Mask(padding=attention_mask.bool())
        x = self.embed(input_ids, token_type_ids, attention_mask)  # (B, S, E_emb)
        if self.project is not None:
            x = self.project(x)  # (B, S, E)
        # 2. The layers, each returning the weight rows asked of it.
        last = self.num_layers - 1 if max_layer is None else max_layer
        requests = self.row_requests(last, layers, queries, fused)
        bias = self.position_bias(input_ids.size(1), x)  # (1, H, S, S) or None
        x, attentions = layer_loop(
            x, last + 1, lambda n, x: self.blocks[self.block_index(n)](x, mask, requests[n], bias)
        )
        return ForwardOutput(hidden_states=x, attentions=attentions)


def build(config: dict[str, Any]) -> BertEncoder:
    return BertEncoder(BertConfig.from_dict(config))


# Names inside one encoder layer, shared by BERT, RoBERTa, XLM-R and ELECTRA.
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
