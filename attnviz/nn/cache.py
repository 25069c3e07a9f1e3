"""A key/value cache: what generation keeps of the tokens already run, so that each new
token costs one query against the stored keys instead of a pass over the whole text.

Per layer one key buffer (B, G, S, D) and one value buffer (B, G, S, Dv), in the model's
dtype, holding the keys *after* the position transform (rotary embeddings are applied once,
at each token's own position, as transformers' ``DynamicCache`` stores them). A step's new
keys and values are appended; the step's queries then attend to every stored key, under the
family's mask for their positions (causal, sliding window) built by the stack.

The cache reaches the attention modules as the running pass's context (``using``), as the
taps do (nn/taps.py), so that no block of any family changes its signature; the layer loop
(architectures/base.py) says which layer runs. Self-attention modules (tap role ``attn``)
append to it; an encoder-decoder's cross-attention (``cross``) keeps the encoder's keys and
values, projected once (``KVCache.cross``). torch + stdlib only.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

# attention.QKTransform and MultiHeadAttention.project, spelled out: attention.py reads this module.
QKTransform = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
Projection = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


class KVCache:
    """The keys and values of every layer run so far.

    Attributes:
        keys, values: per layer, (B, G, S, D) and (B, G, S, Dv), or None before the first pass.
        layer: the layer running now (set by the layer loop).
    """

    def __init__(self, layers: int) -> None:
        if layers < 1:
            raise ValueError(f"a cache needs at least one layer, not {layers}")
        self.keys: list[Tensor | None] = [None] * layers
        self.values: list[Tensor | None] = [None] * layers
        self.cross_kv: list[tuple[Tensor, Tensor] | None] = [None] * layers
        self.layer = 0

    @property
    def length(self) -> int:
        """S: the tokens whose keys the first layer holds (the prompt and what was generated)."""
        first = self.keys[0]
        return 0 if first is None else first.size(2)

    def offset(self) -> int:
        """Keys the running layer held before this step: the position of the step's first token."""
        held = self.keys[self.layer]
        return 0 if held is None else held.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the step's k (B, G, L, D) and v (B, G, L, Dv) for the running layer and
        return every key and value it holds now: (B, G, S, D), (B, G, S, Dv)."""
        n = self.layer
        held_k, held_v = self.keys[n], self.values[n]
        if held_k is not None and held_v is not None:
            k = torch.cat((held_k, k), dim=2)  # (B, G, S, D)
            v = torch.cat((held_v, v), dim=2)  # (B, G, S, Dv)
        self.keys[n], self.values[n] = k, v
        return k, v

    def cross(self, project: Projection, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """An encoder-decoder's cross-attention in the running layer: q (B, H, L, D) of the
        step's decoder tokens, and the encoder's k (B, G, S, D) and v (B, G, S, Dv),
        projected at the first step and kept (the encoder's output does not change)."""
        held = self.cross_kv[self.layer]
        if held is None:
            q, k, v = project(query, key, value)
            self.cross_kv[self.layer] = (k, v)
            return q, k, v
        q, _, _ = project(query, key[:, :0], value[:, :0])  # the keys and values of no token: q alone
        return q, *held


_ACTIVE: contextvars.ContextVar[KVCache | None] = contextvars.ContextVar("attnviz_kv_cache", default=None)


def active() -> KVCache | None:
    """The cache of the running pass, or None (a plain forward pass)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(cache: KVCache | None) -> Iterator[KVCache | None]:
    """Run the passes inside with ``cache`` (None: without one)."""
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)


def shifted(transform: QKTransform | None, offset: int) -> QKTransform | None:
    """A position transform (q, k) -> (q, k) built for positions 0..offset+L-1, applied to
    a step's q (B, H, L, D) and k (B, G, L, D) at positions offset..offset+L-1.

    The step's rows are placed after ``offset`` zero rows, transformed, and taken back: any
    transform that works position by position (rotary embeddings, with or without a norm
    after them) gives each row what it gives at that position in a full pass."""
    if transform is None or offset == 0:
        return transform

    def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        pad_q = q.new_zeros(*q.shape[:2], offset, q.size(-1))  # (B, H, offset, D)
        pad_k = k.new_zeros(*k.shape[:2], offset, k.size(-1))  # (B, G, offset, D)
        q_all, k_all = transform(torch.cat((pad_q, q), dim=2), torch.cat((pad_k, k), dim=2))
        return q_all[:, :, offset:], k_all[:, :, offset:]  # (B, H, L, D), (B, G, L, D)

    return apply
