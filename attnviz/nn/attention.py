"""Multi-head attention, written out as the textbook states it (Vaswani et al. 2017, §3.2).

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) · W^O
    head_i             = softmax(Q·W_i^Q · (K·W_i^K)ᵀ / √d_k) · V·W_i^V

with d_k = d_v = d_model / h. The h per-head matrices W_i^Q (d_model × d_k) sit
side by side as the column blocks of one d_model × (h·d_k) matrix
W^Q = [W_1^Q | ... | W_h^Q], so one ``nn.Linear`` computes every Q_i at once and
a reshape hands each head its own block. Nothing is averaged: every head's weights
come back separately.

In reading order: the eager function ``softmax_attention`` returning
(output, weights), the masks (``causal_mask``, ``padding_mask``, and ``Mask``, a mask
described rather than materialised), ``eager_attention`` (the function with grouped
key/value heads and a mask), and ``MultiHeadAttention``, the module every family's
layers are built on. This is the reference everything is tested against.

A layer may be asked for less or computed faster through its ``Attend`` strategy (rows.py's
``RowRequest``: the fused kernel with the asked rows exactly beside it). Nothing here is an
optimisation.

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
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from . import cache as kv_cache
from . import taps

# (q, k) -> (q, k): applied to the projected, split heads before the dot product.
# This is where rotary position embeddings enter (Llama-family models).
QKTransform = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    score_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q·kᵀ · scale + score_bias) · v, per head, returning the output and the weights.

    Args:
        q: (B, H, L, D) queries.
        k: (B, H, S, D) keys.
        v: (B, H, S, Dv) values.
        mask: boolean, broadcastable to (B, H, L, S); True = may attend.
        scale: defaults to 1/√D.
        score_bias: float, broadcastable to (B, H, L, S), added to the scaled scores
            before the softmax: a learned position bias (T5's relative position buckets).
            Masked positions stay exactly 0 whatever the bias. (Not the projections'
            ``bias`` of ``MultiHeadAttention``.)
        softcap: attention logit soft-capping (Gemma 2): the scores become
            softcap · tanh(scores / softcap) before the mask and the softmax, so no
            logit leaves (-softcap, softcap).
        sinks: (H,) learned per-head sink logits (GPT-OSS): each row's softmax runs
            over the S scores and one extra logit that belongs to no key; that column
            is dropped afterwards, so a row's weights sum to 1 - its sink share.

    Returns:
        output (B, H, L, Dv) and weights (B, H, L, S). Each weight row sums to 1 (to
        1 - the sink's share with ``sinks``); masked positions hold exactly 0, and a
        row with nothing to attend to is all 0.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1))
    # 1. Similarity of every query with every key. (Scaled in place: at 2,048 tokens a
    #    second (B, H, L, S) tensor made this function 1.8x slower than torch's module.)
    scores = (q @ k.transpose(-2, -1)).mul_(scale)  # (B, H, L, S)
    if score_bias is not None:
        scores = scores.add_(score_bias)  # (B, H, L, S)
    if softcap is not None:
        # In this order (divide, tanh, multiply), as transformers' Gemma 2.
        scores = torch.tanh(scores / softcap) * softcap  # (B, H, L, S)
    # 2. Forbidden positions get -inf, so softmax gives them exactly 0.
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    # 3. Normalise each query's row into a distribution over keys (and the sink), in
    #    float32 whatever the model's dtype, then back, as transformers' eager attention
    #    does: half-precision exp/sum loses digits, and the reference must round alike.
    if sinks is None:
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)  # (B, H, L, S)
    else:
        b, h, length, _ = scores.shape
        sink = sinks.to(scores.dtype).reshape(1, h, 1, 1).expand(b, h, length, 1)  # (B, H, L, 1)
        combined = torch.cat((scores, sink), dim=-1)  # (B, H, L, S+1)
        # The max subtracted first, as transformers' GPT-OSS does (softmax itself would
        # too; doing it twice is what makes the weights bit-identical).
        combined = combined - combined.max(dim=-1, keepdim=True).values
        weights = torch.softmax(combined, dim=-1)[..., :-1]  # (B, H, L, S): the sink column dropped
    if mask is not None:
        # A fully masked row (a padding query) is exp(-inf - -inf) = NaN; make it 0. (Out of
        # place under autograd: softmax's backward reads its output.)
        weights = weights.masked_fill(~mask, 0.0) if weights.requires_grad else weights.masked_fill_(~mask, 0.0)
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


@dataclass(frozen=True)
class Mask:
    """Which keys each query may see, described rather than materialised.

    An (L, S) boolean matrix is 1 GiB at 32k tokens, and a fused causal kernel needs
    none; so a layer builds only the block of rows it is working on (``rows``).
    Queries and keys are the same positions 0..S-1 (self-attention).

    Attributes:
        causal: query i sees keys 0..i.
        window: and only the last ``window`` of them: i-window < j <= i (sliding window).
        chunk: and only those of its own chunk of ``chunk`` positions: j // chunk == i // chunk
            (Llama 4's chunked attention).
        padding: (B, S) boolean, True = real token; padding keys are seen by no query.
    """

    causal: bool = False
    window: int | None = None
    padding: Tensor | None = None
    chunk: int | None = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"window={self.window} must be at least 1")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"chunk={self.chunk} must be at least 1")
        if self.padding is not None and (self.padding.dtype != torch.bool or self.padding.dim() != 2):
            raise ValueError(
                f"padding must be a (B, S) boolean tensor, not {self.padding.dtype} {tuple(self.padding.shape)}"
            )

    def rows(self, index: Tensor, length: int) -> Tensor | None:
        """(B or 1, 1, R, S) boolean rows ``index`` (R,) of the mask; None when all True."""
        if not self.causal and self.window is None and self.padding is None and self.chunk is None:
            return None
        keys = torch.arange(length, device=index.device)  # (S,)
        mask = torch.ones(len(index), length, dtype=torch.bool, device=index.device)  # (R, S)
        if self.causal:
            mask &= keys[None, :] <= index[:, None]
        if self.window is not None:
            mask &= keys[None, :] > index[:, None] - self.window
        if self.chunk is not None:
            mask &= keys[None, :] // self.chunk == index[:, None] // self.chunk
        out = mask[None, None]  # (1, 1, R, S)
        if self.padding is not None:
            out = out & self.padding.to(index.device)[:, None, None, :]  # (B, 1, R, S)
        return out

    def dense(self, length: int, device: torch.device | str | None = None) -> Tensor | None:
        """(B or 1, 1, S, S) boolean: the whole matrix (the eager path's mask)."""
        return self.rows(torch.arange(length, device=device), length)


MaskLike = Tensor | Mask | None


def repeat_kv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Grouped-query attention: each key/value head serves H/G query heads."""
    group = q.size(1) // k.size(1)
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, S, D)


def eager_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskLike, scale: float | None, **modifiers: Any
) -> tuple[Tensor, Tensor]:
    """The reference: every weight of a layer, by the textbook formula.

    Args:
        q: (B, H, L, D); k: (B, G, S, D); v: (B, G, S, Dv).
        mask: ``Mask`` or boolean tensor, True = may attend.
        modifiers: keyword arguments of ``softmax_attention`` (a score bias,
            soft-capping, sinks); None values are ignored.

    Returns:
        output (B, H, L, Dv) and weights (B, H, L, S).
    """
    modifiers = {name: value for name, value in modifiers.items() if value is not None}
    k, v = repeat_kv(q, k, v)  # (B, H, S, D)
    dense = mask.dense(k.size(2), q.device) if isinstance(mask, Mask) else mask
    return softmax_attention(q, k, v, dense, scale, **modifiers)  # (B, H, L, Dv), (B, H, L, S)


# How a layer attends, (q, k, v, mask, scale, **modifiers) -> (output, weights):
# ``eager_attention`` (the default), or rows.py's ``RowRequest`` (only the asked rows).
Attend = Callable[..., tuple[Tensor, Tensor]]


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
        softcap: attention logit soft-capping (see ``softmax_attention``).
        sinks: whether each head has a learned sink logit, the parameter ``sinks`` (H,).

    Projections are named ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``
    (``o_proj`` is W^O).
    """

    # This module's name in its layer's taps: blocks.N.attn.z; a decoder's cross-attention
    # is "cross" (nn/taps.py).
    tap_role = "attn"

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
        softcap: float | None = None,
        sinks: bool = False,
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
        self.scale, self.softcap = scale, softcap
        # W^Q = [W_1^Q | ... | W_H^Q]: the H per-head projections side by side.
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias if out_bias is None else out_bias)
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None

    def _split(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        # Contiguous: the (T, T)-sized products then run on dense blocks (measured: the
        # strided layout made q·kᵀ and weights·v 1.8x slower at 2,048 tokens).
        return x.view(b, t, heads, self.head_dim).transpose(1, 2).contiguous()  # (B, heads, T, D)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Step 1 of ``forward``: q (B, H, L, D), k (B, G, S, D), v (B, G, S, Dv) from
        query (B, L, E) and key, value (B, S, E). Here Dv = D and each is one linear map;
        a family that makes its heads otherwise (mla.py's latent attention) overrides
        this alone and keeps steps 2-4."""
        q = self._split(self.q_proj(query), self.n_heads)  # (B, H, L, D)
        k = self._split(self.k_proj(key), self.n_kv_heads)  # (B, G, S, D)
        v = self._split(self.v_proj(value), self.n_kv_heads)  # (B, G, S, D)
        return q, k, v

    # Whether ``gate_output`` scales each head's output by a gate of the query (Qwen3-Next):
    # a key's part of the output then depends on the query, so the norm measure refuses.
    output_gated = False

    def gate_output(self, z: Tensor, query: Tensor) -> Tensor:
        """Between steps 2 and 3: each head's output z (B, L, H, Dv) as W^O reads it (the
        ``z`` tap sees it after this); unchanged here. A gated family (qwen3_next.py)
        multiplies it by σ(its gate of ``query`` (B, L, E))."""
        return z

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
        """Attend from ``query`` to ``key``/``value`` (self-attention when both are None).

        Args:
            query: (B, L, E).
            key, value: (B, S, E); default to ``query``.
            mask: a ``Mask``, or boolean broadcastable to (B, H, L, S); True = may attend.
            qk_transform: applied to the split heads q (B, H, L, D) and k (B, G, S, D),
                e.g. rotary position embeddings.
            request: how the weights are computed and which rows come back: the eager
                reference by default (every row); a ``rows.RowRequest`` picks rows and
                the fused kernel.
            score_bias: float, broadcastable to (B, H, L, S), added to the scores before the
                softmax (T5's relative position bias; the rows then come from the eager function).

        Returns:
            output (B, L, E) and per-head weights (B, H, R, S): R = L for every row.
        """
        key = query if key is None else key
        value = key if value is None else value
        # 1. Per-head projections Q_i = Q·W_i^Q, K_i = K·W_i^K, V_i = V·W_i^V (a generation
        #    step's cross-attention reuses the encoder's K_i and V_i, projected once).
        q, k, v = kv_cache.projected(self.tap_role, self.project, query, key, value)  # (B, H, L, D), (B, G, S, D/Dv)
        if qk_transform is not None:
            q, k = qk_transform(q, k)
        site = taps.active()  # None unless a pass attached taps (nn/taps.py)
        if site is not None:
            q, k, v = site(f"{self.tap_role}.q", q), site(f"{self.tap_role}.k", k), site(f"{self.tap_role}.v", v)
        k, v = kv_cache.joined(self.tap_role, k, v)  # with generation's stored keys (nn/cache.py)
        if site is not None:  # what the weights are computed from (explain, kept rows)
            site.terms(self, q, k, mask, score_bias, request, qk_transform)
        # 2. head_i = softmax(Q_i K_iᵀ / √d_k) V_i, all heads at once; with grouped-query
        #    attention each key/value head serves H/G query heads (``repeat_kv``).
        heads, weights = request(
            q, k, v, mask, self.scale, score_bias=score_bias, softcap=self.softcap, sinks=self.sinks
        )  # (B, H, L, D), (B, H, R, S)
        if site is not None:  # a replaced pattern: each head's output is then its weights · V
            heads, weights = site.pattern(self.tap_role, heads, weights, q, v)
        # 3. Concat(head_1, ..., head_H): put the heads back side by side.
        z = heads.transpose(1, 2)  # (B, L, H, Dv); Dv = D but in multi-head latent attention (mla.py)
        z = self.gate_output(z, query)  # the identity but in gated attention (qwen3_next.py)
        if site is not None:
            z = site(f"{self.tap_role}.z", z)
        b, length, _, dv = z.shape
        concat = z.reshape(b, length, self.n_heads * dv)  # (B, L, H·Dv)
        # 4. ·W^O.
        out = self.o_proj(concat)  # (B, L, E)
        return (out if site is None else site(f"{self.tap_role}.out", out)), weights
