"""Multi-head attention, written out as the textbook states it.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) · W^O
    head_i             = softmax(Q·W_i^Q · (K·W_i^K)ᵀ / √d_k) · V·W_i^V

with d_k = d_v = d_model / h. The h per-head matrices W_i^Q (d_model × d_k) sit
side by side as the column blocks of one d_model × (h·d_k) matrix
W^Q = [W_1^Q | ... | W_h^Q], so one ``nn.Linear`` computes every Q_i at once and
a reshape hands each head its own block. Nothing is averaged: every head's weights
come back separately. This is the manual path that keeps the weights; fused SDPA is
only a test oracle here.

Shape legend (as in PyTorch's ``scaled_dot_product_attention``):
    B batch, H query heads, G key/value heads (G divides H; G = H without
    grouped-query attention), L query length, S key length, D head dim,
    E model dim (d_model).

Masks follow one convention everywhere in attnviz: boolean, True = may attend.
torch + stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

# (q, k) -> (q, k): applied to the projected, split heads before the dot product.
# This is where rotary position embeddings enter (Llama-family models).
QKTransform = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q·kᵀ · scale + bias) · v, per head, returning the output and the weights.

    Args:
        q: (B, H, L, D) queries.
        k: (B, H, S, D) keys.
        v: (B, H, S, Dv) values.
        mask: boolean, broadcastable to (B, H, L, S); True = may attend.
        scale: defaults to 1/√D.
        bias: float, broadcastable to (B, H, L, S), added to the scaled scores before the
            softmax: a learned position bias (T5's relative position buckets). Masked
            positions stay exactly 0 whatever the bias.

    Returns:
        output (B, H, L, Dv) and weights (B, H, L, S). Each weight row sums to 1;
        masked positions hold exactly 0, and a row with nothing to attend to is all 0.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1))
    # 1. Similarity of every query with every key.
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, L, S)
    if bias is not None:
        scores = scores + bias  # (B, H, L, S)
    # 2. Forbidden positions get -inf, so softmax gives them exactly 0.
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # 3. Normalise each query's row into a distribution over keys.
    weights = torch.softmax(scores, dim=-1)  # (B, H, L, S)
    if mask is not None:
        # A fully masked row (a padding query) is softmax(-inf, ...) = NaN; make it 0.
        weights = weights.masked_fill(~mask, 0.0)
    # 4. Mix the values.
    return weights @ v, weights  # (B, H, L, Dv), (B, H, L, S)


def causal_mask(length: int, device: torch.device | str | None = None, window: int | None = None) -> Tensor:
    """(L, L) boolean lower-triangular mask: query i may attend to keys 0..i.

    With ``window`` (sliding-window attention, Mistral/Qwen2), only to the last
    ``window`` keys: i-window < j <= i.
    """
    mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()  # (L, L)
    if window is not None:
        if window < 1:
            raise ValueError(f"window={window} must be at least 1")
        mask = mask.triu(-(window - 1))  # (L, L)
    return mask


def padding_mask(attention_mask: Tensor) -> Tensor:
    """(B, S) 1/0 attention mask from a tokenizer -> (B, 1, 1, S) boolean, True = real token."""
    return attention_mask.bool()[:, None, None, :]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with per-head projections, returning (output, weights).

    Args:
        d_model: E, the model (embedding) width.
        n_heads: H, the number of query heads.
        n_kv_heads: G, key/value heads (grouped-query attention); defaults to H.
            Query heads h·G/H .. share key/value head h // (H/G).
        head_dim: D; defaults to E / H.
        bias: whether the q/k/v projections carry biases.
        out_bias: whether W^O carries a bias; defaults to ``bias``.
        scale: the factor on q·kᵀ; defaults to 1/√D.

    Projections are named ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``
    (``o_proj`` is W^O).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        out_bias: bool | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
            head_dim = d_model // n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.scale = scale
        # W^Q = [W_1^Q | ... | W_H^Q]: the H per-head projections side by side.
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias if out_bias is None else out_bias)

    def _split(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, D)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        qk_transform: QKTransform | None = None,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value`` (self-attention when both are None).

        Args:
            query: (B, L, E).
            key, value: (B, S, E); default to ``query``.
            mask: boolean, broadcastable to (B, H, L, S); True = may attend.
            qk_transform: applied to the split heads q (B, H, L, D) and k (B, G, S, D),
                e.g. rotary position embeddings.
            bias: float, broadcastable to (B, H, L, S), added to the scores before the
                softmax (T5's relative position bias).

        Returns:
            output (B, L, E) and per-head weights (B, H, L, S).
        """
        key = query if key is None else key
        value = key if value is None else value
        # 1. Per-head projections Q_i = Q·W_i^Q, K_i = K·W_i^K, V_i = V·W_i^V.
        q = self._split(self.q_proj(query), self.n_heads)  # (B, H, L, D)
        k = self._split(self.k_proj(key), self.n_kv_heads)  # (B, G, S, D)
        v = self._split(self.v_proj(value), self.n_kv_heads)  # (B, G, S, D)
        if qk_transform is not None:
            q, k = qk_transform(q, k)
        # 2. Grouped-query attention: each key/value head serves H/G query heads.
        if self.n_kv_heads != self.n_heads:
            group = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(group, dim=1)  # (B, H, S, D)
            v = v.repeat_interleave(group, dim=1)  # (B, H, S, D)
        # 3. head_i = softmax(Q_i K_iᵀ / √d_k) V_i, all heads at once.
        heads, weights = scaled_dot_product_attention(q, k, v, mask, self.scale, bias)  # (B, H, L, D), (B, H, L, S)
        # 4. Concat(head_1, ..., head_H): put the heads back side by side.
        b, _, length, _ = heads.shape
        concat = heads.transpose(1, 2).reshape(b, length, self.n_heads * self.head_dim)  # (B, L, H·D)
        # 5. ·W^O.
        return self.o_proj(concat), weights
