"""Any query's rows of one text after a single forward pass: each layer's q and k kept.

The row path (rows.py) runs the fused kernel for a layer's output and computes the asked
rows exactly beside it, ``attention_rows(q, k, rows, mask, scale)``. Which rows are asked
changes nothing else in the pass, so with every layer's q and k kept from one pass the
rows of any other query are that same function on the same tensors: no second pass.

The explorer needs this on a long text: each new window of query tokens was a forward
pass over the whole text (~100 s at 8,192 tokens on the 32-layer × 32-head bench decoder,
nearly all of it the fused kernel over 32 layers of 8-dim heads), and is now
L × H × R × S products and softmaxes (bench/explore_latency.py --long). The price is
memory: L × (H + G) × S × D floats (335 MiB for the bench decoder at 8,192 tokens),
checked against a budget before the pass.

``capture`` records, during one pass, each layer's ``scores`` tap (nn/taps.py: the q, k,
mask and scale the layer's weights are computed from, ``ScoreTerms``); ``KeptRows``
answers later queries from them. The value norms of the norm measure
(attnviz.measures.norms, Kobayashi et al. 2020) are recorded in the same pass through the
``v`` taps, so norm rows α·‖f(x)‖ need no pass either. What cannot be kept this way (an
engine that does not tap the score terms: the hf engine; score modifiers such as
soft-capping or sink logits, which the fused request sends to the eager function; q and
k over the budget) leaves ``KeptRows`` unmade: callers run a pass per query set.

Shape legend as in rows.py: N layers, B batch, H query heads, G key/value heads, R asked
rows, S keys, D head dim. torch + stdlib only.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..tokens import Tokens
from .rows import attention_rows
from .taps import ScoreTerms, Taps, tap_name

if TYPE_CHECKING:
    from ..engines import Engine
    from ..result import Attention


@dataclass
class Capture:
    """What one pass recorded: each layer's score terms, and its value norms when they
    could be recorded, by model layer number."""

    calls: dict[int, list[ScoreTerms]] = field(default_factory=dict)
    norms: dict[int, Tensor] | None = None  # (1, H, S) per layer run


# One token of id 0: the probe pass that reads the shapes and dtype of q and k.
_PROBE = Tokens(text="x", ids=(0,), pieces=("x",), offsets=((0, 1),), special=(False,))


def kept_bytes(engine: Engine, layers: Sequence[int], num_tokens: int) -> int | None:
    """Bytes that q and k of ``layers`` take at ``num_tokens`` tokens (None: an engine that
    does not tap the score terms, the hf engine, a family whose attention our module does
    not score (DeBERTa), or an encoder-decoder: nothing can be kept). Read from the
    ``scores`` tap of a one-token pass through the first attention layer (H, G, D and the
    dtype's size, as the layers make them)."""
    from ..errors import UnsupportedArchitectureError

    if engine.parts:
        return None
    first = engine.shape.layers[0]
    probe = Taps().record(tap_name(None, first, "scores"))
    try:
        with engine.tapping(probe):
            engine.forward(_PROBE, (first,), ())
    except UnsupportedArchitectureError:
        return None
    if tap_name(None, first, "scores") not in probe:  # a layer not scored by our module (DeBERTa's)
        return None
    terms: ScoreTerms = probe[tap_name(None, first, "scores")]
    q, k = terms.q, terms.k  # (1, H, 1, D), (1, G, 1, D)
    return len(layers) * (q.size(1) + k.size(1)) * num_tokens * q.size(-1) * q.element_size()


@contextmanager
def capture(engine: Engine, active: bool = True) -> Iterator[Capture]:
    """Record, inside the block, the score terms of every layer of ``engine``'s only stack
    (or encoder) through its ``scores`` taps, and the value norms (``norms.observe``),
    where the heads split W^O. Nothing of the pass changes; ``active=False`` (or an engine
    that does not tap the score terms) records nothing."""
    from ..errors import MeasureError, UnsupportedArchitectureError
    from ..measures.norms import observe
    from .taps import attention_layer

    into = Capture()
    if not active or engine.parts:
        yield into
        return
    taps = Taps().record("blocks.*.attn.scores")
    try:
        record = observe(engine, taps)
    except MeasureError:
        record = None  # a gated attention: the weights are kept, the norm measure takes a pass
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(engine.tapping(taps))
        except UnsupportedArchitectureError:
            yield into
            return
        yield into
    for name, calls in taps.recorded.items():
        layer = attention_layer(name)
        if layer is not None:
            into.calls[layer] = calls
    if record is not None:
        into.norms = {layer: n for name, n in record.named().items() if (layer := attention_layer(name)) is not None}


class KeptRows:
    """The rows of any query tokens of one text, from the q and k one pass kept.

    ``template``: the pass's own ``Attention`` (raw: no reading option), whose tokens,
    layers and provenance every answer shares.
    """

    def __init__(self, template: Attention, calls: Sequence[ScoreTerms], norms: Sequence[Tensor] | None) -> None:
        self.template = template
        self._calls = list(calls)
        self._norms = None if norms is None else list(norms)

    @classmethod
    def from_capture(cls, template: Attention, caught: Capture, family: str) -> KeptRows | None:
        """The kept rows of ``caught``, or None when they would not be the pass's rows
        (one call per layer shown, each a fused request without score modifiers:
        ``ScoreTerms.plain``)."""
        layers = template.layers
        if not all(len(caught.calls.get(layer, ())) == 1 and caught.calls[layer][0].plain for layer in layers):
            return None
        calls = [caught.calls[layer][0] for layer in layers]
        found = caught.norms
        # the weights still without the norms; the norm measure then takes a pass
        norms = [found[layer] for layer in layers] if found is not None and set(layers) <= set(found) else None
        return cls(template, calls, norms)

    @property
    def has_norms(self) -> bool:
        return self._norms is not None

    def rows(self, queries: Sequence[int], measure: str = "weight") -> Attention:
        """The raw rows of ``queries`` (token positions, in the order given) in every kept
        layer and head, as ``pipeline.forward`` returns them for the same pass.

        Raises:
            ValueError: a measure that needs value norms, none recorded.
            EngineError: the rows hold NaN or infinite values.
        """
        from ..errors import EngineError
        from ..io.checkpoint import first_nonfinite_layer
        from ..measures.base import measure_named

        m = measure_named(measure)
        if m.needs_values and self._norms is None:
            raise ValueError("no value norms were recorded in the pass")
        asked = tuple(int(q) for q in queries)
        with torch.inference_mode():
            picked = torch.cat(
                [attention_rows(c.q, c.k, asked, c.mask, c.scale) for c in self._calls]
            )  # (N, H, R, S), float32
            if m.needs_values:
                assert self._norms is not None
                picked = m.combine(picked, torch.cat(self._norms).float())  # (N, H, R, S) from (N, H, S)
        weights = picked.cpu().numpy().astype(np.float32, copy=False)
        bad = first_nonfinite_layer(weights, self.template.layers)
        if bad is not None:  # as pipeline.forward says it
            what = "weights" if m.sums_to_one else "norms"
            raise EngineError(
                f"the attention {what} of layer {bad} hold NaN or infinite values",
                hint="the weights overflow in this dtype or are damaged; try float32 or another checkpoint",
            )
        return dataclasses.replace(self.template, weights=weights, queries=asked, measure=measure)
