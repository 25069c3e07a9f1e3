"""ALiBi, attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test
Long"): no position embeddings; head h adds m_h · j to its score for key j,

    score_ij = q_i·k_j / √D + m_h · j            (BLOOM)
    score_ij = (q_i·k_j + m_h · j) / √D          (Falcon's eager attention: the bias is
                                                  scaled with the scores)

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

from ..attention import Attend, MaskLike, MultiHeadAttention, QKTransform, eager_attention


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

    ``bias_scale``: the factor on m_h · j (1 in BLOOM; 1/√D in Falcon, which scales the
    biased scores). The bias is a score modifier, so the asked rows come from the eager
    function in row blocks (exact by construction), not the fused kernel.
    """

    def __init__(self, *args: Any, bias_scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bias_scale = bias_scale

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
        slopes = alibi_slopes(self.n_heads, query.device)  # (H,)
        # Key positions 0..S-1 (right padding keeps every real token's); float32, then the
        # model's dtype, as transformers builds its alibi tensor.
        positions = torch.arange(keys, device=query.device)  # (S,)
        alibi = (slopes[:, None] * positions[None, :]).to(query.dtype)  # (H, S)
        if self.bias_scale != 1.0:
            alibi = alibi * self.bias_scale
        alibi = alibi[None, :, None, :]  # (1, H, 1, S)
        bias = alibi if score_bias is None else score_bias + alibi
        return super().forward(query, key, value, mask, qk_transform, request, bias)
