"""RoBERTa and XLM-RoBERTa: BERT's encoder with fairseq's position numbering.

The one quirk: positions do not start at 0. fairseq numbers real tokens
padding_idx+1, padding_idx+2, ... and gives padding the padding index itself, so
a checkpoint with max_position_embeddings=514 and padding_idx=1 reads at most
512 tokens. Everything else is BERT (bert.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .bert import RULES as BERT_RULES
from .bert import BertConfig, BertEncoder, Embeddings

MODEL_TYPES = ("roberta", "xlm-roberta")
PREFIXES = ("roberta.",)
RULES = BERT_RULES

# transformers' RobertaConfig default, for configs that leave pad_token_id out.
DEFAULT_PAD_TOKEN_ID = 1


class RobertaEmbeddings(Embeddings):
    def __init__(self, c: BertConfig) -> None:
        super().__init__(c)
        self.padding_idx = DEFAULT_PAD_TOKEN_ID if c.pad_token_id is None else c.pad_token_id

    def position_ids(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, S): padding_idx + 1 + (count of real tokens so far); padding keeps padding_idx.

        Real tokens are those of ``attention_mask`` when given (a batch padded with any
        id), else those that are not the padding id (fairseq's and transformers' rule)."""
        real = (input_ids.ne(self.padding_idx) if attention_mask is None else attention_mask.bool()).int()  # (B, S)
        return (torch.cumsum(real, dim=1) * real).long() + self.padding_idx  # (B, S)


def build(config: dict[str, Any]) -> BertEncoder:
    c = BertConfig.from_dict(config)
    model = BertEncoder(c, embed=RobertaEmbeddings(c))
    # The first padding_idx+1 rows of the position table are never used by real tokens.
    pad = DEFAULT_PAD_TOKEN_ID if c.pad_token_id is None else c.pad_token_id
    model.max_positions = c.max_position_embeddings - pad - 1
    return model
