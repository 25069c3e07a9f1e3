"""Multi-head attention, written out as the textbook states it (Vaswani et al. 2017, §3.2).

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) · W^O
    head_i             = softmax(Q·W_i^Q · (K·W_i^K)ᵀ / √d_k) · V·W_i^V

with d_k = d_v = d_model / h. The h per-head matrices W_i^Q (d_model × d_k) sit
side by side as the column blocks of one d_model × (h·d_k) matrix
W^Q = [W_1^Q | ... | W_h^Q], so one ``nn.Linear`` computes every Q_i at once and
a reshape hands each head its own block. Nothing is averaged: every head's weights
come back separately.

In reading order: the eager function ``scaled_dot_product_attention`` returning
(output, weights), the masks (``causal_mask``, ``padding_mask``, and ``Mask``, a mask
described rather than materialised), ``eager_attention`` (the function with grouped
key/value heads and a mask), and ``MultiHeadAttention``, the module every family's
layers are built on. This is the reference everything is tested against.

A layer may be asked for less or computed faster: the module takes an ``Attend``
strategy, and rows.py's ``RowRequest`` is the one the models pass (torch's fused kernel
for the output, the asked query rows' weights computed exactly beside it).

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
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from . import taps

# (q, k) -> (q, k): applied to the projected, split heads before the dot product.
# This is where rotary position embeddings enter (Llama-family models).
QKTransform = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def scaled_dot_product_attention(
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
    if score_bias is None and softcap is None and sinks is None and _in_blocks(q, k, v):
        # Steps 1-4 below, bit for bit, one cache-sized block of rows at a time (CPU).
        return _plain_in_blocks(q, k, v, mask, scale)  # (B, H, L, Dv), (B, H, L, S)
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
        weights = _softmax_(scores)  # (B, H, L, S)
    else:
        b, h, length, _ = scores.shape
        sink = sinks.to(scores.dtype).reshape(1, h, 1, 1).expand(b, h, length, 1)  # (B, H, L, 1)
        combined = torch.cat((scores, sink), dim=-1)  # (B, H, L, S+1)
        # The max subtracted first, as transformers' GPT-OSS does (softmax itself would
        # too; doing it twice is what makes the weights bit-identical).
        combined = combined - combined.max(dim=-1, keepdim=True).values
        weights = torch.softmax(combined, dim=-1)[..., :-1]  # (B, H, L, S): the sink column dropped
    if mask is not None:
        # A fully masked row (a padding query) is exp(-inf - -inf) = NaN; make it 0.
        weights = weights.masked_fill_(~mask, 0.0)
    # 4. Mix the values.
    return weights @ v, weights  # (B, H, L, Dv), (B, H, L, S)


# Weights one block holds: 2^18 float32 = 1 MiB, an L2 cache's size on most x86 cores
# (measured on a 1 MiB-L2 core at 2,048 tokens: 1 MiB blocks 131.8 ms, 512 KiB 135.9,
# 256 KiB 148.0, 128 KiB 161.8, the unblocked steps 143.5).
BLOCK_ELEMENTS = 1 << 18


def _in_blocks(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether ``_plain_in_blocks`` applies: CPU tensors of one (B, H) shape, no autograd
    (``out=`` products record no graph)."""
    if not q.is_cpu or q.dim() != 4 or k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2]:
        return False
    return not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))


Block = tuple[tuple[Any, ...], tuple[Any, ...]]  # (index into (B·H, L, ·), index into (B, H, L, ·))


def _blocks(b: int, h: int, length: int, keys: int) -> list[Block]:
    """Blocks of about ``BLOCK_ELEMENTS`` weights: all of them when they fit, else whole
    heads of one batch element (h', L, S) while a head fits, else rows of one head (l, S)."""
    if b * h * length * keys <= BLOCK_ELEMENTS:
        return [((), ())]  # the whole tensors
    rows = max(1, BLOCK_ELEMENTS // max(1, keys))
    if rows >= length:
        step = rows // max(1, length)
        return [
            ((slice(i * h + j, i * h + min(j + step, h)),), (i, slice(j, j + step)))
            for i in range(b)
            for j in range(0, h, step)
        ]
    return [
        ((i * h + j, slice(r, r + rows)), (i, j, slice(r, r + rows)))
        for i in range(b)
        for j in range(h)
        for r in range(0, length, rows)
    ]


def _plain_in_blocks(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    """Steps 1-4 of ``scaled_dot_product_attention`` without score modifiers, the same
    float operations in the same order, one cache-sized block of rows at a time.

    The unblocked steps pass over the (B, H, L, S) scores five times (the product writes
    them, the scale, the softmax's reads and writes, the product with v), each from
    memory once they outgrow the cache; here each block is written by q·kᵀ, scaled,
    masked, normalised and multiplied into v while it stays in cache, and the weights
    go to memory once. A weight depends on its own row only, and a product's element on
    its own row and column, so the blocks give the unblocked result bit for bit
    (tests/test_attention.py holds them to the textbook order in three dtypes).

    Args: as ``scaled_dot_product_attention``; q, k, v share (B, H).
    Returns: output (B, H, L, Dv) and weights (B, H, L, S).
    """
    b, h, length, d = q.shape
    keys, dv = k.size(2), v.size(-1)
    # (B, H, ·, ·) -> (B·H, ·, ·): views when contiguous, so that bmm and mm run on them
    # as they are (torch.matmul on the 4-D operands with out= was ~12% slower at 128 tokens).
    q3 = q.reshape(b * h, length, d)  # (B·H, L, D)
    kt = k.reshape(b * h, keys, d).transpose(1, 2)  # (B·H, D, S)
    v3 = v.reshape(b * h, keys, dv)  # (B·H, S, Dv)
    weights = q.new_empty(b * h, length, keys)  # (B·H, L, S)
    out = q.new_empty(b * h, length, dv)  # (B·H, L, Dv)
    allowed = None if mask is None else mask.expand(b, h, length, keys)  # (B, H, L, S), a view
    for block, in_mask in _blocks(b, h, length, keys):
        product = torch.mm if len(block) == 2 else torch.bmm  # rows of one head, or whole heads
        heads = block[:1]  # the key and value heads of the block's queries
        w = weights[block]  # (B·H, L, S), (h', L, S) or (l, S)
        product(q3[block], kt[heads], out=w)  # 1. q·kᵀ
        w.mul_(scale)
        forbidden = None if allowed is None else (~allowed[in_mask]).reshape(w.shape)
        if forbidden is not None:  # 2. forbidden positions get -inf
            w.masked_fill_(forbidden, float("-inf"))
        _softmax_block_(w)  # 3. softmax in float32, back into the block
        if forbidden is not None:  # a fully masked row is NaN: make it 0
            w.masked_fill_(forbidden, 0.0)
        product(w, v3[heads], out=out[block])  # 4. mix the values
    return out.view(b, h, length, dv), weights.view(b, h, length, keys)


def _softmax_(scores: Tensor) -> Tensor:
    """torch.softmax(scores, -1, dtype=float32).to(scores.dtype), written back into
    ``scores`` one ``BLOCK_ELEMENTS`` block of rows at a time: bit-identical, without a
    second (B, H, L, S) tensor. (Measured at 2,048 tokens: a fresh 128 MB result's page
    faults made the softmax 3x slower than over 1 MB row blocks.) The path of the score
    modifiers; the plain formula runs whole in blocks (``_plain_in_blocks``)."""
    if not scores.is_contiguous() or (scores.requires_grad and torch.is_grad_enabled()):
        # Out of place: ``out=`` softmax has no derivative, and gradients may be wanted.
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    rows = scores.view(-1, scores.size(-1))
    step = max(1, BLOCK_ELEMENTS // max(1, scores.size(-1)))
    for start in range(0, rows.size(0), step):
        _softmax_block_(rows[start : start + step])
    return scores


def _softmax_block_(block: Tensor) -> None:
    """torch.softmax(block, -1, dtype=float32).to(block.dtype), written back into ``block``
    (contiguous rows). A float32 block is softmaxed into itself, as torch's
    nn.MultiheadAttention fast path does (its native kernel calls _softmax_out(scores,
    scores)): each row's max and sum are read before the row is written. Saves a copy of
    every block (~15% of the softmax at 2,048 tokens); tests/test_attention.py holds it to
    the out-of-place result."""
    if block.dtype == torch.float32:
        torch.softmax(block, dim=-1, out=block)
    else:
        block.copy_(torch.softmax(block, dim=-1, dtype=torch.float32))


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
        padding: (B, S) boolean, True = real token; padding keys are seen by no query.
    """

    causal: bool = False
    window: int | None = None
    padding: Tensor | None = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"window={self.window} must be at least 1")
        if self.padding is not None and (self.padding.dtype != torch.bool or self.padding.dim() != 2):
            raise ValueError(
                f"padding must be a (B, S) boolean tensor, not {self.padding.dtype} {tuple(self.padding.shape)}"
            )

    @property
    def plain_causal(self) -> bool:
        """Causal and nothing else: the fused kernel's ``is_causal`` says it all."""
        return self.causal and self.window is None and self.padding is None

    def rows(self, index: Tensor, length: int) -> Tensor | None:
        """(B or 1, 1, R, S) boolean rows ``index`` (R,) of the mask; None when all True."""
        if not self.causal and self.window is None and self.padding is None:
            return None
        keys = torch.arange(length, device=index.device)  # (S,)
        mask = torch.ones(len(index), length, dtype=torch.bool, device=index.device)  # (R, S)
        if self.causal:
            mask &= keys[None, :] <= index[:, None]
        if self.window is not None:
            mask &= keys[None, :] > index[:, None] - self.window
        out = mask[None, None]  # (1, 1, R, S)
        if self.padding is not None:
            out = out & self.padding.to(index.device)[:, None, None, :]  # (B, 1, R, S)
        return out

    def dense(self, length: int, device: torch.device | str | None = None) -> Tensor | None:
        """(B or 1, 1, S, S) boolean: the whole matrix (the eager path's mask)."""
        return self.rows(torch.arange(length, device=device), length)

    def key_range(self, start: int, stop: int, length: int) -> tuple[int, int]:
        """Keys [lo, hi) that queries start..stop-1 may see at all (a causal block needs
        no keys after it; a windowed one none before its window)."""
        hi = stop if self.causal else length
        lo = max(0, start - self.window + 1) if self.window is not None and self.causal else 0
        return lo, hi


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
        modifiers: keyword arguments of ``scaled_dot_product_attention`` (a score bias,
            soft-capping, sinks); None values are ignored.

    Returns:
        output (B, H, L, Dv) and weights (B, H, L, S).
    """
    modifiers = {name: value for name, value in modifiers.items() if value is not None}
    k, v = repeat_kv(q, k, v)  # (B, H, S, D)
    dense = mask.dense(k.size(2), q.device) if isinstance(mask, Mask) else mask
    return scaled_dot_product_attention(q, k, v, dense, scale, **modifiers)  # (B, H, L, Dv), (B, H, L, S)


class Attend(Protocol):
    """How a layer computes its attention from the split heads: (output, weights).

    ``eager_attention`` is one (the default); rows.py's ``RowRequest`` is the other (the
    fused kernel's output and only the asked rows' weights)."""

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, mask: MaskLike, scale: float | None, **modifiers: Any
    ) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class Ablation:
    """Heads whose output is removed before W^O, one head per batch element made.

    The layer's input has batch 1 (the unablated stream); its output has batch
    ``len(heads)``: element b is that one output with head ``heads[b]``'s slice of
    Concat(head_1, ..., head_H) replaced by zero, or by ``fill[heads[b]]`` (the head's
    mean output, mean-ablation). Residual sums broadcast the batch-1 stream against
    it, so every later layer runs once per ablated head, in one batched pass.
    A request (``rows.RowRequest``) carries it to the layer as ``ablation``.

    Attributes:
        heads: query heads in 0..H-1, one per batch element.
        fill: None (zero-ablation) or (H, D): each head's replacement vector.
    """

    heads: tuple[int, ...]
    fill: Tensor | None = None

    def __post_init__(self) -> None:
        if not self.heads or min(self.heads) < 0:
            raise ValueError(f"an ablation needs heads in 0..H-1, not {self.heads}")
        if self.fill is not None and self.fill.dim() != 2:
            raise ValueError(f"fill must be (H, D), not {tuple(self.fill.shape)}")


def ablate_heads(concat: Tensor, n_heads: int, ablation: Ablation) -> Tensor:
    """Concat(head_1, ..., head_H) with one head removed per new batch element.

    Args:
        concat: (1, L, H·D), the heads side by side, before W^O.
        n_heads: H.
        ablation: which head each of the B = len(heads) copies loses, and with what.

    Returns:
        (B, L, H·D): copy b equals ``concat`` except head ``heads[b]``'s D columns, which
        hold 0 or ``fill[heads[b]]`` at every position.
    """
    if concat.size(0) != 1:
        raise ValueError(f"an ablated layer takes the batch-1 unablated stream, not batch {concat.size(0)}")
    if max(ablation.heads) >= n_heads:
        raise ValueError(f"head {max(ablation.heads)} is out of range for {n_heads} heads")
    _, length, width = concat.shape
    b, d = len(ablation.heads), width // n_heads
    out = concat.expand(b, length, width).reshape(b, length, n_heads, d).clone()  # (B, L, H, D)
    return remove_heads_(out, ablation).reshape(b, length, width)  # (B, L, H·D)


def remove_heads_(heads: Tensor, ablation: Ablation) -> Tensor:
    """In place on the heads side by side, (B, L, H, D) with B = len(ablation.heads): copy
    b's head ``ablation.heads[b]`` becomes 0, or ``fill[heads[b]]``, at every position.
    ``ablate_heads`` and the hf engine's hook on W^O (``ablation_hf.ablating``) both use it."""
    index = torch.arange(len(ablation.heads), device=heads.device)
    which = torch.as_tensor(ablation.heads, device=heads.device)
    if ablation.fill is None:
        heads[index, :, which] = 0.0
    else:
        heads[index, :, which] = ablation.fill.to(heads)[which][:, None, :]  # (B, 1, D) over every position
    return heads


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
        softcap: attention logit soft-capping (see ``scaled_dot_product_attention``).
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

    def own_score_bias(self, keys: int, dtype: torch.dtype, device: Any = None) -> Tensor | None:
        """The bias this module adds to its scaled scores by itself, beside any ``score_bias``
        it is given, broadcastable to (1, H, 1, S); None here (ALiBi's modules add one).
        What reads the scores back (explain) adds it as the module does."""
        return None

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
            score_bias: float, broadcastable to (B, H, L, S), added to the scores before
                the softmax (T5's relative position bias). A score modifier: the asked rows
                then come from the eager function in row blocks, not the fused kernel.

        Returns:
            output (B, L, E) and per-head weights (B, H, R, S): R = L for every row.
        """
        key = query if key is None else key
        value = key if value is None else value
        # 1. Per-head projections Q_i = Q·W_i^Q, K_i = K·W_i^K, V_i = V·W_i^V.
        q, k, v = self.project(query, key, value)  # (B, H, L, D), (B, G, S, D), (B, G, S, Dv)
        if qk_transform is not None:
            q, k = qk_transform(q, k)
        site = taps.active()  # None unless a pass attached taps (nn/taps.py)
        if site is not None:
            q, k, v = site(f"{self.tap_role}.q", q), site(f"{self.tap_role}.k", k), site(f"{self.tap_role}.v", v)
        # 2. head_i = softmax(Q_i K_iᵀ / √d_k) V_i, all heads at once; with grouped-query
        #    attention each key/value head serves H/G query heads (``repeat_kv``). Score
        #    modifiers (a position bias, soft-capping, sinks) send a fused request to the
        #    blocked eager path (rows.attend).
        heads, weights = request(
            q, k, v, mask, self.scale, score_bias=score_bias, softcap=self.softcap, sinks=self.sinks
        )  # (B, H, L, D), (B, H, R, S)
        # 3. Concat(head_1, ..., head_H): put the heads back side by side.
        z = heads.transpose(1, 2)  # (B, L, H, Dv); Dv = D but in multi-head latent attention (mla.py)
        z = self.gate_output(z, query)  # the identity but in gated attention (qwen3_next.py)
        if site is not None:
            weights, z = site(f"{self.tap_role}.pattern", weights), site(f"{self.tap_role}.z", z)
        b, length, _, dv = z.shape
        concat = z.reshape(b, length, self.n_heads * dv)  # (B, L, H·Dv)
        ablation: Ablation | None = getattr(request, "ablation", None)
        if ablation is not None:  # head ablation (rows.RowRequest.ablation): one copy per removed head
            concat = ablate_heads(concat, self.n_heads, ablation)  # (B', L, H·D)
        # 4. ·W^O.
        out = self.o_proj(concat)  # (B, L, E)
        return (out if site is None else site(f"{self.tap_role}.out", out)), weights
