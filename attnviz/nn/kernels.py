"""torch's fused attention kernel, called so that it stays fused on every device and dtype.

``torch.nn.functional.scaled_dot_product_attention`` picks a backend per call: flash,
memory-efficient, cuDNN or the math fallback, which materialises every (L, S) score
matrix (137 GB per layer for 32 heads at 32k tokens). Which fused backend accepts a
call depends on the device, the dtype and grouped-query attention (``enable_gqa``):

    CPU    one fused kernel for float32, bfloat16 and float16, GQA included: called as is.
    CUDA   bfloat16/float16: flash attention, GQA included. float32: flash refuses
           float32 and the memory-efficient kernel refuses ``enable_gqa``, so torch
           would fall back to the math kernel; the H/G copies of each key/value head
           are made instead (``expand_kv``: B·H·S·D more, not L·S) and the
           memory-efficient kernel runs.

On CUDA the math backend is excluded, so that no call falls back silently; should no
fused kernel accept one (an unusual head size, a mask layout), the call runs through
the math kernel one block of query rows at a time, keeping the scores of one block.

Shapes as in ``attnviz.nn.attention``: q (B, H, L, D); k, v (B, G, S, D); G divides H.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor

# Score elements one fallback block may hold: 2^26 float32 = 256 MiB.
FALLBACK_ELEMENTS = 1 << 26


def blocks(count: int, size: int, elements: int) -> list[tuple[int, int]]:
    """[start, stop) ranges over ``count`` items of ``size`` elements each (query rows, heads),
    as many items a range as ``elements`` hold, at least one: the one block helper of every
    row-blocking loop (rows.py's cache-blocked eager steps and row chunks, and the math fallback here)."""
    step = max(1, elements // max(1, size))
    return [(start, min(start + step, count)) for start in range(0, count, step)]


def expands_for_gqa(device_type: str, dtype: torch.dtype) -> bool:
    """Whether GQA calls copy the key/value heads (True) or pass ``enable_gqa`` (False)."""
    return device_type == "cuda" and dtype == torch.float32


def expand_kv(k: Tensor, v: Tensor, group: int) -> tuple[Tensor, Tensor]:
    """Each of the G key/value heads repeated for its ``group`` = H/G query heads."""
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, S, D)


@contextlib.contextmanager
def _fused_only(device_type: str) -> Iterator[None]:
    """No math fallback on CUDA (a fused backend or an error); elsewhere as torch chooses."""
    if device_type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(SDPBackend.CUDNN_ATTENTION)
    with sdpa_kernel(backends), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns for each backend that declines
        yield


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """softmax(q·kᵀ · scale + mask) · v by a fused kernel, no weights kept.

    Args:
        q: (B, H, L, D); k, v: (B, G, S, D), G divides H.
        attn_mask: boolean broadcastable to (B, H, L, S), True = may attend (or None).
        is_causal: query i sees keys 0..i (L = S).

    Returns:
        (B, H, L, Dv) in q's dtype.
    """
    f = torch.nn.functional.scaled_dot_product_attention
    group = q.size(1) // k.size(1)
    if group > 1 and expands_for_gqa(q.device.type, q.dtype):
        k, v = expand_kv(k, v, group)  # (B, H, S, D)
        group = 1
    try:
        with _fused_only(q.device.type):
            return f(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=group > 1)
    except RuntimeError:
        if q.device.type != "cuda":
            raise
    if group > 1:  # no fused kernel took enable_gqa here: the copies, then a fused kernel again
        k, v = expand_kv(k, v, group)  # (B, H, S, D)
        try:
            with _fused_only(q.device.type):
                return f(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
        except RuntimeError:
            pass
    return _blocked_math(q, k, v, attn_mask, is_causal, scale, False)


def _blocked_math(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float | None, gqa: bool
) -> Tensor:
    """The math kernel over blocks of query rows: one block's (B, H, l, S) scores at a time."""

    b, h, length, _ = q.shape
    keys = k.size(2)
    out = q.new_empty(b, h, length, v.size(-1))  # (B, H, L, Dv)
    f = torch.nn.functional.scaled_dot_product_attention
    for start, stop in blocks(length, b * h * keys, FALLBACK_ELEMENTS):
        mask = None
        if attn_mask is not None:
            mask = attn_mask if attn_mask.dim() < 2 or attn_mask.size(-2) == 1 else attn_mask[..., start:stop, :]
        if is_causal:
            rows = torch.arange(start, stop, device=q.device)[:, None]  # (l, 1)
            causal = torch.arange(keys, device=q.device)[None, :] <= rows  # (l, S)
            mask = causal if mask is None else mask & causal
        out[:, :, start:stop] = f(q[:, :, start:stop], k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out
