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

    Per layer one preallocated key buffer (B, G, C, D) and value buffer (B, G, C, Dv) of
    capacity C: a step writes its keys into the next free slots and the attention reads a
    view of the first S. ``reserve`` sizes the buffers at the first pass (generation knows
    prompt + tokens to write); past it the capacity doubles. torch.cat per step copied the
    whole cache each step: at a 1,024-token prompt of a GPT-2-small shape that was 80 MB a
    step, as much time as the step's attention (bench/generate_bench.py).

    Attributes:
        layer: the layer running now (set by the layer loop).
    """

    def __init__(self, layers: int, reserve: int = 0) -> None:
        if layers < 1:
            raise ValueError(f"a cache needs at least one layer, not {layers}")
        self._keys: list[Tensor | None] = [None] * layers
        self._values: list[Tensor | None] = [None] * layers
        self._held = [0] * layers
        self.reserve = reserve
        self.cross_kv: list[tuple[Tensor, Tensor] | None] = [None] * layers
        # Other per-token tensors a layer keeps (DeepSeek-V3.2's indexer keys), by (layer, name).
        self.extras: dict[tuple[int, str], Tensor] = {}
        self.layer = 0

    @property
    def keys(self) -> list[Tensor | None]:
        """Per layer, the stored keys (B, G, S, D), or None before the first pass."""
        return [None if k is None else k[:, :, :s] for k, s in zip(self._keys, self._held, strict=True)]

    @property
    def values(self) -> list[Tensor | None]:
        """Per layer, the stored values (B, G, S, Dv), or None before the first pass."""
        return [None if v is None else v[:, :, :s] for v, s in zip(self._values, self._held, strict=True)]

    @property
    def length(self) -> int:
        """S: the tokens whose keys the first layer holds (the prompt and what was generated)."""
        return self._held[0]

    def offset(self) -> int:
        """Keys the running layer held before this step: the position of the step's first token."""
        return self._held[self.layer]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the step's k (B, G, L, D) and v (B, G, L, Dv) for the running layer and
        return every key and value it holds now: views (B, G, S, D), (B, G, S, Dv)."""
        n, held, step = self.layer, self._held[self.layer], k.size(2)
        buf_k, buf_v = self._keys[n], self._values[n]
        if buf_k is None or buf_v is None or held + step > buf_k.size(2):
            capacity = max(held + step, self.reserve if buf_k is None else 2 * buf_k.size(2))
            grown_k = k.new_empty(*k.shape[:2], capacity, k.size(3))  # (B, G, C, D)
            grown_v = v.new_empty(*v.shape[:2], capacity, v.size(3))  # (B, G, C, Dv)
            if buf_k is not None and buf_v is not None:
                grown_k[:, :, :held], grown_v[:, :, :held] = buf_k[:, :, :held], buf_v[:, :, :held]
            buf_k, buf_v = self._keys[n], self._values[n] = grown_k, grown_v
        buf_k[:, :, held : held + step] = k
        buf_v[:, :, held : held + step] = v
        self._held[n] = held + step
        return buf_k[:, :, : held + step], buf_v[:, :, : held + step]

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

    def extend(self, name: str, x: Tensor) -> Tensor:
        """Store the step's ``x`` (B, L, ...) under ``name`` for the running layer and return
        all it holds now, (B, S, ...): per-token state besides keys and values."""
        key = (self.layer, name)
        held = self.extras.get(key)
        self.extras[key] = x if held is None else torch.cat((held, x), dim=1)
        return self.extras[key]


def joined(role: str, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """A self-attention module's (tap role "attn") step keys (B, G, L, D) and values
    (B, G, L, Dv), after the position transform, joined to the running layer's stored
    ones while generation runs: (B, G, S, D), (B, G, S, Dv); as they are otherwise."""
    cache = _ACTIVE.get()
    if cache is None or role != "attn":
        return k, v
    return cache.append(k, v)


def projected(
    role: str, project: Projection, query: Tensor, key: Tensor, value: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """A module's ``project(query, key, value)``: q, k, v; but an encoder-decoder's
    cross-attention (tap role "cross") while generation runs takes the encoder's keys and
    values projected at the first step (``KVCache.cross``)."""
    cache = _ACTIVE.get()
    if cache is None or role != "cross":
        return project(query, key, value)
    return cache.cross(project, query, key, value)


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
