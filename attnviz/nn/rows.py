"""Exact asked rows beside torch's fused kernel, and chunked eager for full matrices.

attention.py computes a layer the readable way, every (L, S) weight matrix built. This
module computes the same thing with less, chosen per call with a ``RowRequest``:

    eager  attention.softmax_attention's steps, every weight, bit for bit; on CPU
           without score modifiers one cache-sized block of rows at a time, each
           block scored, masked, normalised and mixed while it stays in cache
           (``eager``, ``cache_blocked``).
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
length, S key length, D head dim. Masks: boolean, True = may attend. Every loop over
blocks of rows or heads takes its ranges from one helper, ``kernels.blocks``. torch + stdlib only.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .attention import Mask, MaskLike, repeat_kv, softmax_attention
from .kernels import blocks

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
    # With every row asked (queries None, fused): each block of rows' weights (B, H, l, S)
    # go to blocks(start, stop, weights) as they are made, and none are kept (``streaming``).
    blocks: Callable[[int, int, Tensor], None] | None = field(default=None, compare=False)

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, mask: MaskLike, scale: float | None, **modifiers: Any
    ) -> tuple[Tensor, Tensor]:
        """``attend(q, k, v, mask, scale, self, **modifiers)``: a request is an ``attention.Attend``."""
        return attend(q, k, v, mask, scale, self, **modifiers)


EAGER = RowRequest()  # the reference: full weights, eager math

# (layer, start, stop, weights (B, H, stop - start, S) float32) for each block of query rows.
BlockSink = Callable[[int, int, int, Tensor], None]
_STREAM: contextvars.ContextVar[BlockSink | None] = contextvars.ContextVar("attnviz_row_stream", default=None)


@contextlib.contextmanager
def streaming(sink: BlockSink) -> Iterator[None]:
    """Inside the block, a layer asked for every weight row (``architectures.base.row_requests``
    with queries None and fused) hands each block of rows to ``sink`` as it is computed and
    keeps none: what reads the rows (the corpus detectors) holds one block, not the layer's
    (B, H, S, S) matrix (issue 38: 9.7 GB for one 8,183-token text)."""
    token = _STREAM.set(sink)
    try:
        yield
    finally:
        _STREAM.reset(token)


def stream() -> BlockSink | None:
    """The running pass's block sink (``streaming``), or None."""
    return _STREAM.get()


def feed_blocks(layer: int, weights: Tensor, sink: BlockSink) -> None:
    """Weights already made (B, H, L, S) to ``sink`` in ``chunked_eager``'s blocks of rows,
    in float32 (an engine that cannot stream: transformers returns whole matrices)."""
    b, h, length, keys = weights.shape
    for start, stop in _row_blocks(length, b * h, keys):
        sink(layer, start, stop, weights[:, :, start:stop].float())


def _mask_rows(mask: MaskLike, index: Tensor, length: int) -> Tensor | None:
    """Rows ``index`` of any mask, broadcastable to (B, H, R, S)."""
    if mask is None or isinstance(mask, Mask):
        return None if mask is None else mask.rows(index, length)
    if mask.dim() < 2 or mask.size(-2) == 1:
        return mask  # the same row for every query (a padding mask)
    return mask[..., index.to(mask.device), :]


def _row_blocks(length: int, heads: int, keys: int) -> list[tuple[int, int]]:
    """[start, stop) blocks of query rows holding at most ~CHUNK_ELEMENTS weights each."""
    return blocks(length, heads * keys, CHUNK_ELEMENTS)


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


def _plain_causal(mask: Mask) -> bool:
    """Causal and nothing else: the fused kernel's ``is_causal`` says it all."""
    return mask.causal and mask.window is None and mask.padding is None and mask.chunk is None


def key_range(mask: Mask, start: int, stop: int, length: int) -> tuple[int, int]:
    """Keys [lo, hi) that queries start..stop-1 may see at all under ``mask`` (a causal
    block needs no keys after it; a windowed one none before its window)."""
    hi = stop if mask.causal else length
    lo = max(0, start - mask.window + 1) if mask.window is not None and mask.causal else 0
    if mask.chunk is not None:
        lo = max(lo, start // mask.chunk * mask.chunk)  # keys before the first query's chunk
        hi = min(length, hi if mask.causal else (stop - 1) // mask.chunk * mask.chunk + mask.chunk)
    return lo, hi


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
    if _plain_causal(mask):
        return sdpa(q, k, v, is_causal=True, scale=scale)  # (B, H, L, Dv)
    b, h = q.shape[:2]
    out = q.new_empty(b, h, length, v.size(-1))  # (B, H, L, Dv)
    for start, stop in _row_blocks(length, b * h, keys):
        lo, hi = key_range(mask, start, stop, keys)
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
    consume: Callable[[int, int, Tensor], None] | None = None,
    **modifiers: Any,
) -> tuple[Tensor, Tensor]:
    """The eager function, one block of query rows at a time, in float32.

    Used where every row is wanted (the weights are then the answer, and mixing the
    values with them costs less than a second pass through the fused kernel) and as
    the fallback for attention the fused kernel cannot express (``modifiers`` go to the
    eager function as they are). Each query row's softmax depends on its own scores
    only, so the blocks give exactly the eager result, with (B, H, block, S) scores in
    memory at a time beside the weights kept.

    ``consume`` (with ``queries`` None): each block's weights (B, H, l, S) go to
    ``consume(start, stop, weights)`` and none are kept (the weights returned have no rows).

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
    rows = 0 if consume is not None else length if wanted is None else len(wanted)
    weights = torch.zeros(b, h, rows, keys, dtype=torch.float32, device=q.device)  # (B, H, R, S)
    for start, stop in _row_blocks(length, b * h, keys):
        index = torch.arange(start, stop, device=q.device)
        # A score bias with a row per query (T5's positions) goes to its block row by row.
        block = {
            name: value[..., start:stop, :] if name == "score_bias" and value.size(-2) == length else value
            for name, value in modifiers.items()
        }
        o, w = eager(
            q[:, :, start:stop], k, v, _mask_rows(mask, index, keys), scale, **block
        )  # (B, H, l, Dv), (B, H, l, S)
        out[:, :, start:stop] = o
        if wanted is None:
            if consume is not None:
                consume(start, stop, w)
            else:
                weights[:, :, start:stop] = w
            continue
        for slot, row in enumerate(wanted):
            if start <= row < stop:
                weights[:, :, slot] = w[:, :, row - start]
    return out, weights


# --- the eager steps, cache-blocked (CPU) -------------------------------------------------

# Weights one block holds: 2^18 float32 = 1 MiB, an L2 cache's size on most x86 cores
# (measured on a 1 MiB-L2 core at 2,048 tokens: 1 MiB blocks 131.8 ms, 512 KiB 135.9,
# 256 KiB 148.0, 128 KiB 161.8, the unblocked steps 143.5).
BLOCK_ELEMENTS = 1 << 18


def eager(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None, **modifiers: Any
) -> tuple[Tensor, Tensor]:
    """``attention.softmax_attention``, bit for bit, the cheaper way where there is one: on
    CPU, without score modifiers, one cache-sized block of rows at a time (``cache_blocked``).

    Args: as ``softmax_attention``; q, k, v share (B, H) for the blocked steps.
    Returns: output (B, H, L, Dv) and weights (B, H, L, S).
    """
    if not modifiers and _in_blocks(q, k, v):
        scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
        return cache_blocked(q, k, v, mask, scale)
    return softmax_attention(q, k, v, mask, scale, **modifiers)


def _in_blocks(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether ``cache_blocked`` applies: CPU tensors of one (B, H) shape, no autograd
    (``out=`` products record no graph)."""
    if not q.is_cpu or q.dim() != 4 or k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2]:
        return False
    return not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))


Block = tuple[tuple[Any, ...], tuple[Any, ...]]  # (index into (B·H, L, ·), index into (B, H, L, ·))


def _cache_blocks(b: int, h: int, length: int, keys: int) -> list[Block]:
    """Blocks of about ``BLOCK_ELEMENTS`` weights: all of them when they fit, else whole
    heads of one batch element (h', L, S) while a head fits, else rows of one head (l, S)."""
    if b * h * length * keys <= BLOCK_ELEMENTS:
        return [((), ())]  # the whole tensors
    if length * keys <= BLOCK_ELEMENTS:
        return [
            ((slice(i * h + j0, i * h + j1),), (i, slice(j0, j1)))
            for i in range(b)
            for j0, j1 in blocks(h, length * keys, BLOCK_ELEMENTS)
        ]
    return [
        ((i * h + j, slice(r0, r1)), (i, j, slice(r0, r1)))
        for i in range(b)
        for j in range(h)
        for r0, r1 in blocks(length, keys, BLOCK_ELEMENTS)
    ]


def cache_blocked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    """Steps 1-4 of ``attention.softmax_attention`` without score modifiers, the same
    float operations in the same order, one cache-sized block of rows at a time.

    The unblocked steps pass over the (B, H, L, S) scores five times (the product writes
    them, the scale, the softmax's reads and writes, the product with v), each from
    memory once they outgrow the cache; here each block is written by q·kᵀ, scaled,
    masked, normalised and multiplied into v while it stays in cache, and the weights
    go to memory once. A weight depends on its own row only, and a product's element on
    its own row and column, so the blocks give the unblocked result bit for bit
    (tests/test_rows.py holds them to the textbook order in three dtypes).

    Args: as ``softmax_attention``; q, k, v share (B, H); ``scale`` given.
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
    for block, in_mask in _cache_blocks(b, h, length, keys):
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


def _softmax_block_(block: Tensor) -> None:
    """torch.softmax(block, -1, dtype=float32).to(block.dtype), written back into ``block``
    (contiguous rows). A float32 block is softmaxed into itself, as torch's
    nn.MultiheadAttention fast path does (its native kernel calls _softmax_out(scores,
    scores)): each row's max and sum are read before the row is written. Saves a copy of
    every block (~15% of the softmax at 2,048 tokens); tests/test_rows.py holds it to
    the out-of-place result."""
    if block.dtype == torch.float32:
        torch.softmax(block, dim=-1, out=block)
    else:
        block.copy_(torch.softmax(block, dim=-1, dtype=torch.float32))


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
        # The reference: every weight, by the textbook steps (in cache-sized blocks on CPU).
        k, v = repeat_kv(q, k, v)  # (B, H, S, D)
        dense = mask.dense(k.size(2), q.device) if isinstance(mask, Mask) else mask
        out, weights = eager(q, k, v, dense, scale, **modifiers)  # (B, H, L, S)
        if request.queries is not None and tuple(request.queries) != tuple(range(length)):
            weights = weights[:, :, list(request.queries)]  # (B, H, R, S)
        return out, weights
    if modifiers or request.queries is None:
        return chunked_eager(q, k, v, mask, scale, request.queries, request.blocks, **modifiers)
    # 1. The output, from the fused kernel: no (L, S) matrix is kept.
    out = fused_attention(q, k, v, mask, scale)  # (B, H, L, Dv)
    # 2. The weights, only where asked, from the same q, k, mask and scale.
    if request.queries == ():
        return out, q.new_zeros(q.size(0), q.size(1), 0, k.size(2), dtype=torch.float32)
    return out, attention_rows(q, k, request.queries, mask, scale)
