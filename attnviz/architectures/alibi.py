"""ALiBi, attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test
Long"): no position embeddings; head h adds m_h · j to its score for key j,

    score_ij = q_i·k_j / √D + m_h · j                    (BLOOM)
    score_ij = q_i·k_j / √D + bf16(m_h · j) / √D         (Falcon-RW: transformers' Falcon
                                                          rounds m_h · j to bfloat16, then
                                                          scales it as the scores)

which, under the softmax of row i, is the paper's -m_h · (i - j): a constant per row
cancels. The slopes are geometric: for H a power of two, m_h = 2^(-8(h+1)/H); otherwise
the 2^⌊log2 H⌋ slopes of the nearest power of two, then every other slope of twice as
many heads (the paper's recipe, as transformers computes it in float32).

A module of helpers shared by bloom.py and falcon.py, not a family. torch only.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..nn import cache as kv_cache
from ..nn.attention import Attend, MaskLike, MultiHeadAttention, QKTransform, eager_attention


def alibi_slopes(num_heads: int, device: Any = None) -> Tensor:
    """(H,) float32 slopes m_h, bit for bit as transformers' ``_get_alibi_slopes``."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(closest) - 3))), device=device, dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, device=device, dtype=torch.int32))  # (closest,)
    if closest != num_heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * closest) - 3))), device=device, dtype=torch.float32)
        remaining = min(closest, num_heads - closest)
        odd = torch.arange(1, 1 + 2 * remaining, 2, device=device, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra, odd)], dim=0)  # (H,)
    return slopes


class AlibiAttention(MultiHeadAttention):
    """Multi-head attention with ALiBi's per-head linear bias on the key position.

    The bias is built as transformers builds it, operation for operation, so that it is
    the same floats: ``slope_dtype`` is the dtype of the slopes in the product m_h · j
    (float32 in BLOOM; bfloat16 in Falcon, whose ``build_alibi_tensor`` rounds there),
    the product is cast to the model's dtype, then divided by ``divisor`` (None in BLOOM;
    √D in Falcon, which adds the bias after the scores' 1/√D). The bias is a score
    modifier, so the asked rows come from the eager function in row blocks (exact by
    construction), not the fused kernel.
    """

    def __init__(
        self, *args: Any, slope_dtype: torch.dtype = torch.float32, divisor: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.slope_dtype, self.divisor = slope_dtype, divisor

    def alibi(self, keys: int, dtype: torch.dtype, device: Any = None) -> Tensor:
        """(H, S) bias m_h · j for key positions j = 0..S-1, in ``dtype``.

        Right padding keeps every real token's position (transformers counts real tokens
        only, which is the same for them); padded keys are masked anyway.
        """
        slopes = alibi_slopes(self.n_heads, device).to(self.slope_dtype)  # (H,)
        positions = torch.arange(keys, device=device)  # (S,) int64, as transformers' cumsum
        alibi = (slopes[:, None] * positions[None, :]).to(dtype)  # (H, S): the product in slope_dtype
        if self.divisor is not None:
            alibi = alibi / self.divisor  # a division, as transformers (not × 1/√D: other roundings)
        return alibi

    def own_score_bias(self, keys: int, dtype: torch.dtype, device: Any = None) -> Tensor:
        """ALiBi's bias (1, H, 1, S), added to the scaled scores."""
        return self.alibi(keys, dtype, device)[None, :, None, :]

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: MaskLike = None,
        qk_transform: QKTransform | None = None,
        request: Attend = eager_attention,
        score_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        keys = (query if key is None else key).size(1)
        cache = kv_cache.active()
        if cache is not None and key is None:
            keys += cache.offset()  # a generation step: the bias spans the stored keys too
        alibi = self.own_score_bias(keys, query.dtype, query.device)  # (1, H, 1, S)
        bias = alibi if score_bias is None else score_bias + alibi
        return super().forward(query, key, value, mask, qk_transform, request, bias)
