"""Exact asked rows beside torch's fused kernel, and chunked eager for full matrices.

attention.py computes a layer the readable way, every (L, S) weight matrix built. This
module computes the same thing with less, chosen per call with a ``RowRequest``:

    eager  attention.eager_attention: the readable reference, every weight.
    fused  torch's fused ``scaled_dot_product_attention`` computes the layer's output
           without keeping any weights; the weights of the asked query rows only are
           then computed exactly from the same q, k, mask and scale, softmax in
           float32 (``attention_rows``). One token's rows cost H×S floats, not H×S×S.
           When every row is asked for, the weights are the answer: the eager
           function runs on one block of query rows at a time, in float32
           (``chunked_eager``), with no second pass through the fused kernel.

A layer whose attention has score modifiers the fused kernel cannot express (logit
soft-capping, sink logits, a score bias, ...) passes them to ``attend`` as keyword
arguments; they go to the eager function, run one block of query rows at a time
(``chunked_eager``), so the memory stays bounded and the result is the eager one by
construction.

Shape legend as in attention.py: B batch, H query heads, G key/value heads, L query
length, S key length, D head dim. Masks: boolean, True = may attend. torch + stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .attention import Mask, MaskLike, eager_attention, repeat_kv, scaled_dot_product_attention

# Weight elements computed per block of query rows: 2^24 float32 = 64 MiB, whatever the
# length. Measured on CPU: larger blocks are no faster, smaller ones add call overhead.
CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class RowRequest:
    """What one attention call computes beside the layer's output.

    Attributes:
        queries: positions whose weight rows come back; None = every row (the full
            (L, S) matrices); () = none (a layer nobody looks at).
        fused: True: the output from torch's fused kernel, the weights computed exactly
            beside it (``attention_rows``); False: everything by the eager reference.
    """

    queries: tuple[int, ...] | None = None
    fused: bool = False

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, mask: MaskLike, scale: float | None, **modifiers: Any
    ) -> tuple[Tensor, Tensor]:
        """``attend(q, k, v, mask, scale, self, **modifiers)``: a request is an ``attention.Attend``."""
        return attend(q, k, v, mask, scale, self, **modifiers)


EAGER = RowRequest()  # the reference: full weights, eager math


def _mask_rows(mask: MaskLike, index: Tensor, length: int) -> Tensor | None:
    """Rows ``index`` of any mask, broadcastable to (B, H, R, S)."""
    if mask is None or isinstance(mask, Mask):
        return None if mask is None else mask.rows(index, length)
    if mask.dim() < 2 or mask.size(-2) == 1:
        return mask  # the same row for every query (a padding mask)
    return mask[..., index.to(mask.device), :]


def _row_blocks(length: int, heads: int, keys: int) -> list[tuple[int, int]]:
    """[start, stop) blocks of query rows holding at most ~CHUNK_ELEMENTS weights each."""
    size = max(1, CHUNK_ELEMENTS // max(1, heads * keys))
    return [(start, min(start + size, length)) for start in range(0, length, size)]


def attention_rows(
    q: Tensor, k: Tensor, queries: Sequence[int] | None, mask: MaskLike = None, scale: float | None = None
) -> Tensor:
    """The exact attention weights of chosen query rows: softmax(q_rows·kᵀ · scale), in float32.

    Args:
        q: (B, H, L, D) queries, as the layer uses them (after rotary embeddings).
        k: (B, G, S, D) keys; query head h reads key head h // (H/G).
        queries: positions in 0..L-1; None = every row, computed in blocks of rows.
        mask: a ``Mask`` or a boolean tensor broadcastable to (B, H, L, S); True = may attend.
        scale: defaults to 1/√D.

    Returns:
        (B, H, R, S) float32, equal to rows ``queries`` of the eager weights.
    """
    b, h, length, d = q.shape
    g, keys = k.size(1), k.size(2)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if queries is None:
        out = torch.empty(b, h, length, keys, dtype=torch.float32, device=q.device)  # (B, H, L, S)
        for start, stop in _row_blocks(length, b * h, keys):
            out[:, :, start:stop] = attention_rows(q, k, range(start, stop), mask, scale)
        return out
    index = torch.as_tensor(list(queries), dtype=torch.long, device=q.device)  # (R,)
    # 1. The asked rows' scores, in float32 whatever the model's dtype; GQA by grouping the
    #    query heads of each key head rather than copying the keys.
    rows = q.index_select(2, index).float().view(b, g, h // g, len(index), d)  # (B, G, H/G, R, D)
    scores = rows @ k.float()[:, :, None].transpose(-2, -1) * scale  # (B, G, H/G, R, S)
    scores = scores.reshape(b, h, len(index), keys)  # (B, H, R, S)
    # 2. The same mask, the same softmax, the same zeros as the eager path.
    m = _mask_rows(mask, index, keys)
    if m is not None:
        scores = scores.masked_fill(~m, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (B, H, R, S)
    if m is not None:
        weights = weights.masked_fill(~m, 0.0)
    return weights


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: MaskLike = None, scale: float | None = None) -> Tensor:
    """The output of attention by torch's fused kernel, no weights kept.

    Args:
        q: (B, H, L, D); k: (B, G, S, D); v: (B, G, S, Dv); G divides H.
        mask: a ``Mask`` (plain causal runs as ``is_causal``; windows and padding one
            block of query rows at a time, with the block's keys only), or a boolean
            tensor broadcastable to (B, H, L, S); True = may attend.

    Returns:
        (B, H, L, Dv). A query with nothing to attend to gets 0, as in the eager path.
    """
    from .kernels import sdpa  # fused on every device and dtype, GQA included (see kernels.py)

    if mask is None or isinstance(mask, Tensor):
        return sdpa(q, k, v, attn_mask=mask, scale=scale)  # (B, H, L, Dv)
    length, keys = q.size(2), k.size(2)
    if mask.causal and length != keys:
        raise ValueError(f"a causal Mask needs as many queries as keys, not {length} and {keys}")
    if mask.plain_causal:
        return sdpa(q, k, v, is_causal=True, scale=scale)  # (B, H, L, Dv)
    b, h = q.shape[:2]
    out = q.new_empty(b, h, length, v.size(-1))  # (B, H, L, Dv)
    for start, stop in _row_blocks(length, b * h, keys):
        lo, hi = mask.key_range(start, stop, keys)
        m = mask.rows(torch.arange(start, stop, device=q.device), keys)  # (B or 1, 1, l, S)
        block = None if m is None else m[..., lo:hi]  # (B or 1, 1, l, hi-lo)
        out[:, :, start:stop] = sdpa(q[:, :, start:stop], k[:, :, lo:hi], v[:, :, lo:hi], attn_mask=block, scale=scale)
    return out


def chunked_eager(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: MaskLike,
    scale: float | None,
    queries: Sequence[int] | None,
    **modifiers: Any,
) -> tuple[Tensor, Tensor]:
    """The eager function, one block of query rows at a time, in float32.

    Used where every row is wanted (the weights are then the answer, and mixing the
    values with them costs less than a second pass through the fused kernel) and as
    the fallback for attention the fused kernel cannot express (``modifiers`` go to the
    eager function as they are). Each query row's softmax depends on its own scores
    only, so the blocks give exactly the eager result, with (B, H, block, S) scores in
    memory at a time beside the weights kept.

    Returns:
        output (B, H, L, Dv) in q's dtype, and the weights of ``queries`` (B, H, R, S)
        in float32 (None: every row).
    """
    b, h, length, _ = q.shape
    keys, dtype = k.size(2), q.dtype
    k, v = repeat_kv(q, k, v)  # (B, H, S, D)
    q, k, v = q.float(), k.float(), v.float()  # no-ops in float32; the softmax in float32 otherwise
    wanted = None if queries is None else list(queries)
    out = torch.empty(b, h, length, v.size(-1), dtype=dtype, device=q.device)  # (B, H, L, Dv)
    rows = length if wanted is None else len(wanted)
    weights = torch.zeros(b, h, rows, keys, dtype=torch.float32, device=q.device)  # (B, H, R, S)
    for start, stop in _row_blocks(length, b * h, keys):
        index = torch.arange(start, stop, device=q.device)
        # A score bias with a row per query (T5's positions) goes to its block row by row.
        block = {
            name: value[..., start:stop, :] if name == "score_bias" and value.size(-2) == length else value
            for name, value in modifiers.items()
        }
        o, w = scaled_dot_product_attention(
            q[:, :, start:stop], k, v, _mask_rows(mask, index, keys), scale, **block
        )  # (B, H, l, Dv), (B, H, l, S)
        out[:, :, start:stop] = o
        if wanted is None:
            weights[:, :, start:stop] = w
            continue
        for slot, row in enumerate(wanted):
            if start <= row < stop:
                weights[:, :, slot] = w[:, :, row - start]
    return out, weights


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskLike, scale: float | None, request: RowRequest = EAGER, **modifiers: Any
) -> tuple[Tensor, Tensor]:
    """One layer's attention as ``request`` asks: (output, weights of the asked rows).

    Args:
        q: (B, H, L, D); k: (B, G, S, D); v: (B, G, S, Dv).
        mask: ``Mask`` or boolean tensor, True = may attend.
        modifiers: extra keyword arguments of the eager function (score modifiers such
            as soft-capping); None values are ignored. Any other value sends the fused
            request to ``chunked_eager``, since the fused kernel cannot apply them.

    Returns:
        output (B, H, L, Dv) and weights (B, H, R, S): R = L when ``request.queries`` is None.
    """
    modifiers = {name: value for name, value in modifiers.items() if value is not None}
    length = q.size(2)
    if not request.fused:
        # The reference: every weight, by the textbook formula.
        out, weights = eager_attention(q, k, v, mask, scale, **modifiers)  # (B, H, L, S)
        if request.queries is not None and tuple(request.queries) != tuple(range(length)):
            weights = weights[:, :, list(request.queries)]  # (B, H, R, S)
        return out, weights
    if modifiers or request.queries is None:
        return chunked_eager(q, k, v, mask, scale, request.queries, **modifiers)
    # 1. The output, from the fused kernel: no (L, S) matrix is kept.
    out = fused_attention(q, k, v, mask, scale)  # (B, H, L, Dv)
    # 2. The weights, only where asked, from the same q, k, mask and scale.
    if request.queries == ():
        return out, q.new_zeros(q.size(0), q.size(1), 0, k.size(2), dtype=torch.float32)
    return out, attention_rows(q, k, request.queries, mask, scale)
