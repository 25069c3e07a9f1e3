"""MPNet (Song et al. 2020, "MPNet: Masked and Permuted Pre-training for Language
Understanding"; all-mpnet-base-v2): BERT's post-LayerNorm encoder with a T5-style
relative position bias. Deltas from bert.py and roberta.py:

    scores_h(i, j) = q_i·k_j / √D + b_h[bucket(j - i)]     one (buckets, H) table shared by
                                                          every layer, added after the scaling
    bucket(d)      T5's bidirectional buckets (t5.relative_position_bucket): half for keys
                   after the query, half before; |d| < 8 exact, log-spaced up to distance
                   128, the last bucket beyond. Always 32 buckets: transformers'
                   ``compute_position_bias`` never passes ``relative_attention_num_buckets``
                   on, so a larger table's extra rows are never read (a smaller one cannot
                   be indexed at all, and is refused)
    positions      absolute ones too, numbered as RoBERTa's from padding_idx + 1, with
                   padding_idx fixed at 1 whatever ``pad_token_id`` says
    token types    none

torch only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .bert import BertConfig, BertEncoder
from .fields import whole
from .roberta import RobertaEmbeddings
from .t5 import relative_position_bucket

MODEL_TYPES = ("mpnet",)
PREFIXES = ("mpnet.",)

NUM_BUCKETS = 32  # what transformers' MPNetEncoder.compute_position_bias always uses
MAX_DISTANCE = 128
PADDING_IDX = 1  # MPNetEmbeddings.padding_idx, not read from the config


class MPNetEncoder(BertEncoder):
    def __init__(self, c: BertConfig, table_rows: int) -> None:
        super().__init__(c, embed=RobertaEmbeddings(c))
        if table_rows < NUM_BUCKETS:
            raise ValueError(f"relative_attention_num_buckets={table_rows}: MPNet reads {NUM_BUCKETS} position buckets")
        self.relative_bias = nn.Embedding(table_rows, c.num_attention_heads)  # (buckets, H)
        self.max_positions = c.max_position_embeddings - PADDING_IDX - 1

    def position_bias(self, length: int, like: Tensor) -> Tensor:
        """(1, H, S, S): b_h[bucket(j - i)] for query i, key j."""
        positions = torch.arange(length, dtype=torch.long, device=like.device)
        relative = positions[None, :] - positions[:, None]  # (S, S): key - query
        buckets = relative_position_bucket(relative, True, NUM_BUCKETS, MAX_DISTANCE)  # (S, S)
        return self.relative_bias(buckets).permute(2, 0, 1)[None]  # (1, H, S, S)


def build(config: dict[str, Any]) -> MPNetEncoder:
    c = BertConfig.from_dict(config, type_vocab_size=0, pad_token_id=PADDING_IDX)
    return MPNetEncoder(c, whole(config, "relative_attention_num_buckets", NUM_BUCKETS))


RULES = (
    (r"embeddings\.word_embeddings\.(\w+)", r"embed.tokens.\1"),
    (r"embeddings\.position_embeddings\.(\w+)", r"embed.positions.\1"),
    (r"embeddings\.LayerNorm\.(\w+)", r"embed.norm.\1"),
    (r"encoder\.relative_attention_bias\.weight", r"relative_bias.weight"),
    (r"encoder\.layer\.(\d+)\.attention\.attn\.([qkv])\.(\w+)", r"blocks.\1.attn.\2_proj.\3"),
    (r"encoder\.layer\.(\d+)\.attention\.attn\.o\.(\w+)", r"blocks.\1.attn.o_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.LayerNorm\.(\w+)", r"blocks.\1.attn_norm.\2"),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.(\w+)", r"blocks.\1.ffn_in.\2"),
    (r"encoder\.layer\.(\d+)\.output\.dense\.(\w+)", r"blocks.\1.ffn_out.\2"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(\w+)", r"blocks.\1.ffn_norm.\2"),
    # The pooler and the LM head are dropped.
)
