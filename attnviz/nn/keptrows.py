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

``capture`` records, during one pass, what each of our attention modules hands its request
(rows.RowRequest); ``KeptRows`` answers later queries from it. The value norms of the norm
measure (attnviz.measures.norms, Kobayashi et al. 2020) are recorded in the same pass, so norm rows
α·‖f(x)‖ need no pass either. What cannot be kept this way (an engine without our attention
modules, ``Engine.attention_modules``: the hf engine; score modifiers such as soft-capping
or sink logits, which the fused request sends to the eager function; q and k over the
budget) leaves ``KeptRows`` unmade: callers run a pass per query set.

Shape legend as in rows.py: N layers, B batch, H query heads, G key/value heads, R asked
rows, S keys, D head dim. torch + stdlib only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from .attention import MaskLike
from .rows import RowRequest, attention_rows

if TYPE_CHECKING:
    from ..engines import Engine
    from ..result import Attention


@dataclass
class _Call:
    """What one attention call handed its request (the tensors the pass made anyway)."""

    q: Tensor  # (1, H, L, D) after position embeddings
    k: Tensor  # (1, G, S, D)
    mask: MaskLike
    scale: float | None
    exact: bool  # a fused request with no score modifier: its rows are attention_rows's


@dataclass
class Capture:
    """The calls of one pass, in call order, and the value norms when recorded."""

    calls: list[_Call] = field(default_factory=list)
    norms: list[Tensor] | None = None  # (1, H, S) per layer run


class _Recorder:
    """A request that notes its inputs and then does what the module's own request does."""

    def __init__(self, request: Any, into: Capture) -> None:
        self.request, self.into = request, into

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, mask: MaskLike, scale: float | None, **modifiers: Any
    ) -> tuple[Tensor, Tensor]:
        used = any(value is not None for value in modifiers.values())
        exact = isinstance(self.request, RowRequest) and self.request.fused and not used and q.size(0) == 1
        self.into.calls.append(_Call(q, k, mask, scale, exact))
        return self.request(q, k, v, mask, scale, **modifiers)


def kept_bytes(engine: Engine, layers: Sequence[int], num_tokens: int) -> int | None:
    """Bytes that q and k of ``layers`` take at ``num_tokens`` tokens (None: not our
    attention modules (``Engine.attention_modules``), or an encoder-decoder: nothing can
    be kept)."""
    if engine.parts:
        return None
    modules = engine.attention_modules()
    if not modules:
        return None
    m = modules[0][1]
    item = next(m.parameters()).element_size()  # q and k are made in its weights' dtype
    return len(layers) * (m.n_heads + m.n_kv_heads) * num_tokens * m.head_dim * item


@contextmanager
def capture(engine: Engine, active: bool = True) -> Iterator[Capture]:
    """Record, inside the block, what every call of ``engine``'s attention modules (the
    only stack's, or the encoder's: ``Engine.attention_modules``) hands its request, and
    the value norms (``norms.recording``). Nothing of the pass changes; ``active=False``
    (or an engine without our modules) records nothing."""
    from ..measures.norms import own_projections, recording

    into = Capture()
    modules = engine.attention_modules() if active else []
    if not modules:
        yield into
        return

    def hook(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if "request" in kwargs:
            kwargs = {**kwargs, "request": _Recorder(kwargs["request"], into)}
        return args, kwargs

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for _, m in modules]
    try:
        with recording(None, projections=own_projections(modules)) as record:
            yield into
        into.norms = record.part(None)
    finally:
        for handle in handles:
            handle.remove()


class KeptRows:
    """The rows of any query tokens of one text, from the q and k one pass kept.

    ``template``: the pass's own ``Attention`` (raw: no reading option), whose tokens,
    layers and provenance every answer shares.
    """

    def __init__(self, template: Attention, calls: Sequence[_Call], norms: Sequence[Tensor] | None) -> None:
        self.template = template
        self._calls = list(calls)
        self._norms = None if norms is None else list(norms)

    @classmethod
    def from_capture(cls, template: Attention, caught: Capture, family: str) -> KeptRows | None:
        """The kept rows of ``caught``, or None when they would not be the pass's rows
        (a call per layer run, each a fused request without score modifiers)."""
        from ..errors import MeasureError
        from ..measures.norms import per_layer

        run = max(template.layers) + 1
        if len(caught.calls) != run or not all(call.exact for call in caught.calls):
            return None
        calls = [caught.calls[layer] for layer in template.layers]
        norms = None
        if caught.norms is not None:
            try:
                norms = per_layer(caught.norms, run, template.layers, family)
            except MeasureError:
                norms = None  # the weights still; the norm measure then takes a pass
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
