"""Seed-OSS (ByteDance): the Llama stack with its own switch for the bias of W^O.

Deltas from llama.py:

    biases   ``attention_bias`` on q/k/v (on by default), ``attention_out_bias`` on W^O
             (off by default), ``mlp_bias`` on the MLP

Dropout on the residuals is a training matter: none at inference. torch only.
"""

from __future__ import annotations

from typing import Any

from . import llama
from .llama import LlamaConfig, LlamaDecoder

MODEL_TYPES = ("seed_oss",)
PREFIXES = llama.PREFIXES
RULES = llama.RULES


def build(config: dict[str, Any]) -> LlamaDecoder:
    return LlamaDecoder(
        LlamaConfig.from_dict(
            config,
            qkv_bias=bool(config.get("attention_bias", True)),
            o_bias=bool(config.get("attention_out_bias", False)),
        )
    )
