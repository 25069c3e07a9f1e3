"""CamemBERT: RoBERTa's stack (roberta.py) under its own model_type.

CamemBERT (Martin et al. 2020, "CamemBERT: a Tasty French Language Model") is RoBERTa
trained on French: the same post-LayerNorm encoder, the same fairseq position numbering
(real tokens from padding_idx + 1), checkpoints under the same ``roberta.`` prefix.
Nothing differs but the name, so nothing is declared here but the name.
"""

from __future__ import annotations

from .roberta import PREFIXES, RULES, build

MODEL_TYPES = ("camembert",)

__all__ = ["MODEL_TYPES", "PREFIXES", "RULES", "build"]
