"""Patched passes that start after the two prompts' shared prefix (own engine, causal decoders).

In a causal model position i sees positions 0..i only, so where the clean and corrupted
prompts share their first P tokens every activation at positions < P is the same in both
runs, and a patch (which writes the other run's values at matched positions) changes nothing
there. The patched passes then run positions P.. alone, their queries attending to the
prefix's keys and values kept from one pass over it (the generation cache, nn/cache.py): the
work of (Q − P) of the Q positions. The numbers are the same up to float rounding (the
shorter pass multiplies matrices of other shapes); tests/test_patching.py holds them to
transformers like the full passes.

Used by patching.py's loop, never by an analysis directly. torch + stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..nn.cache import KVCache

if TYPE_CHECKING:
    from ..engines import Engine
    from ..tokens import Tokens

# (copies at the patched layer, the patched layer) -> final hidden states (B, Q − P, E)
Forward = Callable[[int, int], torch.Tensor]


def shared_prefix(engine: Engine, run: Tokens, prefix: int, at: int) -> tuple[Forward, int]:
    """How to run the patched passes of ``run``: (forward, P), where forward(count, layer)
    gives the final hidden states of positions P.. (the scored position ``at`` at at − P).
    P is 0 (a plain ``final_hidden`` pass, every position) unless the engine is the own
    engine on a causal decoder the generation cache serves, and 0 < P ≤ at."""
    from ..architectures.decoder import DecoderModel
    from ..generation import CACHED_FAMILIES

    model = getattr(engine, "model", None)
    usable = (
        engine.name == "own"
        and isinstance(model, DecoderModel)
        and getattr(model, "causal", False)
        and engine.files.model_type in CACHED_FAMILIES
        and not model.attention_layers
        and 0 < prefix <= at
    )
    if not usable:
        return (lambda count, layer: engine.final_hidden(run)), 0
    assert isinstance(model, DecoderModel)
    ids = torch.tensor([run.ids], dtype=torch.long, device=engine.device)  # (1, Q)
    held = KVCache(model.num_layers)
    with torch.inference_mode():
        model(ids[:, :prefix], layers=(), queries=(), fused=True, cache=held)  # fills it: (1, G, P, D) a layer

    def forward(count: int, layer: int) -> torch.Tensor:
        with torch.inference_mode():
            return model(ids, layers=(), queries=(), fused=True, cache=_Prefix(held)).hidden_states  # (B, Q − P, E)

    return forward, prefix


class _Prefix(KVCache):
    """The prefix's keys and values, read by every pass and kept by none: a layer's step gets
    them (as many copies as its batch: one before the patched layer, the copies after) in
    front of its own, and nothing is stored, so a pass holds one layer's keys at a time
    (a cache that kept them would hold every layer's, batch × S × D each: 177 MB at 200
    tokens of a GPT-2-small-shaped model, batch 12)."""

    def __init__(self, held: KVCache) -> None:
        super().__init__(len(held.keys))
        self._prefix_keys, self._prefix_values = held.keys, held.values  # per layer (1, G, P, D)
        self._size = held.length

    @property
    def length(self) -> int:
        return self._size

    def offset(self) -> int:
        return self._size

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        held_k, held_v = self._prefix_keys[self.layer], self._prefix_values[self.layer]
        assert held_k is not None and held_v is not None
        batch = k.size(0)
        return (
            torch.cat((held_k.expand(batch, *held_k.shape[1:]), k), dim=2),  # (B, G, S, D)
            torch.cat((held_v.expand(batch, *held_v.shape[1:]), v), dim=2),  # (B, G, S, Dv)
        )
