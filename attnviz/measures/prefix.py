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

if TYPE_CHECKING:
    import torch

    from ..engines import Engine
    from ..tokens import Tokens

# (copies at the patched layer, the patched layer) -> final hidden states (B, Q − P, E)
Forward = Callable[[int, int], "torch.Tensor"]


def shared_prefix(engine: Engine, run: Tokens, prefix: int, at: int) -> tuple[Forward, int]:
    """How to run the patched passes of ``run``: (forward, P), where forward(count, layer)
    gives the final hidden states of positions P.. (the scored position ``at`` at at − P).
    P is 0 (a plain ``final_hidden`` pass, every position) unless the engine is the own
    engine on a causal decoder the generation cache serves, and 0 < P ≤ at."""
    import torch

    from ..architectures.decoder import DecoderModel
    from ..generation import CACHED_FAMILIES
    from ..nn.cache import KVCache

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
        # Layers before the patched one run one copy; from it on, ``count`` (the taps' copies).
        cache = KVCache(model.num_layers)
        for n in range(model.num_layers):
            k, v = held.keys[n], held.values[n]
            assert k is not None and v is not None
            many = n >= layer and count > 1
            cache.keys[n] = k.expand(count, *k.shape[1:]) if many else k
            cache.values[n] = v.expand(count, *v.shape[1:]) if many else v
        with torch.inference_mode():
            return model(ids, layers=(), queries=(), fused=True, cache=cache).hidden_states  # (B, Q − P, E)

    return forward, prefix
