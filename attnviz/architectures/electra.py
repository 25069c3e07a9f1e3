"""ELECTRA (discriminator or generator body): BERT's encoder whose embeddings are
``embedding_size`` wide and projected up to ``hidden_size`` when the two differ
(``embeddings_project``). Everything else is BERT (bert.py).
"""

from __future__ import annotations

from typing import Any

from .bert import RULES as BERT_RULES
from .bert import BertConfig, BertEncoder

MODEL_TYPES = ("electra",)
PREFIXES = ("electra.",)
RULES = (*BERT_RULES, (r"embeddings_project\.(\w+)", r"project.\1"))


def build(config: dict[str, Any]) -> BertEncoder:
    c = BertConfig.from_dict(config)
    # transformers adds the projection only when the widths differ.
    return BertEncoder(c, project=c.embedding_width != c.hidden_size)
