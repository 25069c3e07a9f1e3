"""Ministral 3: Mistral with its queries scaled up, past a length, by Llama 4's
attention temperature.

Deltas from llama.py (mistral):

    q        after RoPE, each query at position i is multiplied by
             1 + β · ln(1 + ⌊i / M⌋)      β = ``rope_parameters.llama_4_scaling_beta``,
                                          M = ``rope_parameters.original_max_position_embeddings``
             (1 below M: short texts are plain Mistral)
    RoPE     yarn by default (rope.py)
    window   ``sliding_window`` on every layer when set; no biases

torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..nn.attention import QKTransform
from . import llama
from .fields import given, whole
from .llama import LlamaConfig, LlamaDecoder

MODEL_TYPES = ("ministral3",)
PREFIXES = llama.PREFIXES
RULES = llama.RULES


@dataclass(frozen=True)
class Ministral3Config(LlamaConfig):
    temperature_beta: float | None = None  # β; None: no query scaling
    temperature_length: int = 1  # M


def query_temperature(length: int, beta: float, original: int, like: Tensor) -> Tensor:
    """(S, 1) factors 1 + β·ln(1 + ⌊i / M⌋), computed in float32 as transformers does, in ``like``'s dtype."""
    positions = torch.arange(length, device=like.device)  # (S,)
    scaling = 1 + beta * torch.log(1 + torch.floor(positions / original))  # (S,)
    return scaling[:, None].to(like.dtype)  # (S, 1): broadcast over D


class Ministral3Decoder(LlamaDecoder):
    config: Ministral3Config

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        rotated = super().qk_transforms(input_ids, x)
        c = self.config
        if c.temperature_beta is None:
            return rotated
        factor = query_temperature(input_ids.size(1), c.temperature_beta, c.temperature_length, x)  # (S, 1)

        def scaled(rotate: QKTransform | None) -> QKTransform:
            def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
                if rotate is not None:
                    q, k = rotate(q, k)
                return q * factor, k  # (B, H, L, D): each query row by its position's factor

            return apply

        return [scaled(qk) for qk in rotated]


def build(config: dict[str, Any]) -> Ministral3Decoder:
    params: Any = given(config, "rope_parameters", {})
    beta = params.get("llama_4_scaling_beta") if isinstance(params, dict) else None
    original = params.get("original_max_position_embeddings") if isinstance(params, dict) else None
    if beta is not None and not isinstance(original, int):
        raise ValueError("rope_parameters.llama_4_scaling_beta needs original_max_position_embeddings")
    if beta is not None:  # the temperature divides positions by it: 0 is no length (issue 38)
        original = whole(
            params, "original_max_position_embeddings", None, name="rope_parameters.original_max_position_embeddings"
        )
    base = LlamaConfig.from_dict(
        {**config, "model_type": "mistral"},  # Mistral's windows and biases
        mlp_bias=False,
    )
    return Ministral3Decoder(
        Ministral3Config(
            **vars(base),
            temperature_beta=None if beta is None else float(beta),
            temperature_length=1 if original is None else int(original),
        )
    )
