"""EuroBERT: the Llama stack as a bidirectional encoder.

Deltas from llama.py:

    mask      none but padding: every token attends to every real token, before and after
              it (transformers' ``create_bidirectional_mask``); no sliding window
    biases    ``attention_bias`` on q/k/v/o, ``mlp_bias`` on the MLP (as Llama)

Everything else as Llama: RMSNorm, RoPE (scaled variants included), grouped-query
attention, SwiGLU, the final norm. The masked-LM and classifier heads are dropped.
torch only.
"""

from __future__ import annotations

from typing import Any

from . import llama
from .llama import LlamaConfig, LlamaDecoder

MODEL_TYPES = ("eurobert",)
PREFIXES = llama.PREFIXES
RULES = llama.RULES


class EuroBert(LlamaDecoder):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__(c)
        self.causal = False  # the stack's masks read it: padding only


def build(config: dict[str, Any]) -> EuroBert:
    layers = int(config["num_hidden_layers"])
    return EuroBert(LlamaConfig.from_dict(config, windows=(None,) * layers))
