"""What a head takes, not only where it looks: the norm-based measure of Kobayashi et al.

Kobayashi, Kuribayashi, Yokoi and Inui (2020, "Attention is Not Only a Weight: Analyzing
Transformers with Vector Norms", EMNLP) rewrite multi-head attention's output at query i as
a sum over heads h and keys j of one vector each:

    y_i = Σ_h Σ_j α_hij · f_h(x_j) + b^O,      f_h(x) = (x·W_h^V + b_h^V) · W_h^O

where W_h^O is the block of W^O's rows that multiplies head h's output (the output bias b^O
belongs to no head). The measure they show is the norm of each term, ‖α_hij · f_h(x_j)‖,
and since α is a non-negative scalar it is α_hij · ‖f_h(x_j)‖: one (H, S) array of value
norms per layer beside the weights, never an (S, S) one. A large weight on a vector of tiny
norm (BERT's [CLS]/[SEP] sinks) contributes little to the output.

Grouped-query attention: head h reads key/value head g = h // (H/G), so f_h uses that
shared value with head h's own W_h^O block.

The value norms are read where every family makes them, on either engine: each layer's
``v`` tap (nn/taps.py, the values as the layer uses them) turns them into norms on the
spot with that layer's W^O (``Engine.head_outputs``), so nothing of the pass changes
(``tapped``). torch + stdlib only.

Shape legend: B batch, H query heads, G key/value heads, S keys, D head dim, E model width.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..errors import MeasureError, Reason
from .base import NORM

if TYPE_CHECKING:
    from ..architectures.seq2seq import Seq2SeqOutput
    from ..nn.taps import Taps

# Per output projection: (the fingerprint of the weight it was computed from, R (H, D, D)).
_R_CACHE: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[Any, ...], Tensor]] = weakref.WeakKeyDictionary()


def fingerprint(weight: Tensor) -> tuple[Any, ...]:
    """What ``weight`` (E, H·D) is, cheaply: its shape, dtype, device, storage, ``a·(W·b)``
    over fixed pseudo-random ``a``, ``b`` (W·b in W's dtype), and ``ΣW`` in float64.

    Not its version counter: writes through ``.data`` (``w.data[...] = x``,
    ``w.data = other``) bump none, and a cache keyed on it served R of the old weight.
    Measured on a 2048×2048 float32 W^O (busy 2-core machine): ~0.1 s against the QR's
    ~12 s. Any edit of a row's dot product with ``b`` beyond its dtype's rounding, or
    of ``ΣW`` beyond float64's, changes the key; an edit no projection sees would have
    to be tuned against these fixed vectors.
    """
    w = weight.detach()
    rows, cols = w.shape[0], w.shape[-1]
    flat = w.reshape(rows, cols)
    gen = torch.Generator().manual_seed(0x5EED)
    a = torch.rand(rows, generator=gen, dtype=torch.float64) + 0.5  # (E,)
    b = torch.rand(cols, generator=gen, dtype=torch.float64) + 0.5  # (H·D,)
    high = torch.float32 if w.device.type == "mps" else torch.float64  # MPS has no float64
    mixed = a.to(w.device, high) @ (flat @ b.to(w.device, w.dtype)).to(high)  # W·b: one pass, no copy of W
    total = flat.sum(dtype=high)
    return (tuple(w.shape), w.dtype, str(w.device), w.data_ptr(), float(mixed), float(total))


def output_blocks(o_weight: Tensor, n_heads: int) -> Tensor:
    """W^O split into the blocks that multiply each head's output.

    Args:
        o_weight: (E, H·D), an ``nn.Linear``'s weight (y = x·Wᵀ), so W^O = o_weightᵀ.

    Returns:
        (H, D, E): ``[h]`` is W_h^O, rows h·D..(h+1)·D of W^O.
    """
    e, width = o_weight.shape
    if width % n_heads:
        raise ValueError(f"W^O has {width} input columns, not a multiple of {n_heads} heads")
    return o_weight.t().reshape(n_heads, width // n_heads, e)  # (H, D, E)


def transformed_values(v: Tensor, o_weight: Tensor, n_heads: int) -> Tensor:
    """f_h(x_j) = v_{g(h), j} · W_h^O for every head and key, written out (the readable
    reference; ``value_norms`` gets their norms without these (B, H, S, E) vectors).

    Args:
        v: (B, G, S, D) the values x_j·W_g^V + b_g^V as the layer uses them.
        o_weight: (E, H·D) the output projection's weight.

    Returns:
        (B, H, S, E) in float32.
    """
    b, g, s, d = v.shape
    blocks = output_blocks(o_weight.detach(), n_heads).float()  # (H, D, E)
    per_head = v.float().repeat_interleave(n_heads // g, dim=1)  # (B, H, S, D)
    return per_head @ blocks[None]  # (B, H, S, E)


def _triangles(o_proj: nn.Module, n_heads: int) -> Tensor:
    """R_h (H, D, D) with W_h^Oᵀ = Q_h·R_h (QR, Q_h with orthonormal columns), so that
    ‖v·W_h^O‖ = ‖v·R_hᵀ·Q_hᵀ‖ = ‖v·R_hᵀ‖: a D×D product per key, not D×E. Computed in
    float64 once per weight (cached while the weight is unchanged)."""
    weight = o_proj.weight
    if not isinstance(weight, Tensor):
        raise TypeError(f"the output projection's weight is a {type(weight).__name__}, not a tensor")
    key = fingerprint(weight)
    cached = _R_CACHE.get(o_proj)
    if cached is not None and cached[0] == key:
        return cached[1]
    blocks = output_blocks(weight.detach(), n_heads)  # (H, D, E)
    high = torch.float32 if weight.device.type == "mps" else torch.float64  # MPS has no float64
    r = torch.linalg.qr(blocks.to(high).transpose(1, 2), mode="r").R.float()  # (H, D, D)
    _R_CACHE[o_proj] = (key, r)
    return r


def value_norms(v: Tensor, o_proj: nn.Module, n_heads: int) -> Tensor:
    """‖f_h(x_j)‖ for every head h and key j (Kobayashi et al. 2020).

    Args:
        v: (B, G, S, D) the values as the layer uses them.
        o_proj: the output projection (an ``nn.Linear`` whose weight is (E, H·D)).

    Returns:
        (B, H, S) float32.
    """
    b, g, s, d = v.shape
    r = _triangles(o_proj, n_heads).to(v.device)  # (H, D, D)
    grouped = r.view(g, n_heads // g, d, d)  # (G, H/G, D, D)
    # v_{g,j} · R_hᵀ for the H/G query heads of each key/value head, without copying v.
    mixed = v.float()[:, :, None] @ grouped.transpose(-1, -2)[None]  # (B, G, H/G, S, D)
    return torch.linalg.vector_norm(mixed, dim=-1).reshape(b, n_heads, s)  # (B, H, S)


def norm_rows(weights: Tensor, norms: Tensor) -> Tensor:
    """‖α_hij · f_h(x_j)‖ = α_hij · ‖f_h(x_j)‖ (α ≥ 0): weights (B, H, R, S) and value norms
    (B, H, S) -> (B, H, R, S). The rows do not sum to 1."""
    return weights.float() * norms.float()[:, :, None, :]


def norm_shares(weights: Tensor, norms: Tensor) -> Tensor:
    """Each row of ``norm_rows`` over its sum: (B, H, R, S) shares of 0..1 summing to 1
    (an all-zero row, a padding query's, stays zero). What corpus detectors read."""
    rows = norm_rows(weights, norms)  # (B, H, R, S)
    total = rows.sum(-1, keepdim=True)
    return torch.where(total > 0, rows / total.clamp_min(torch.finfo(rows.dtype).tiny), torch.zeros_like(rows))


@dataclass
class Recording:
    """Each attention call's value norms, in call order, while a recording is active.

    Attributes:
        calls: (tap name, part, (B, H, S) value norms) per call: part "encoder" for a
            model with one stack, else "encoder", "decoder" (self-attention) or "cross".
    """

    calls: list[tuple[str, str, Tensor]] = field(default_factory=list)

    def part(self, part: str | None) -> list[Tensor]:
        """The value norms of one attention, one per layer run (None: the only stack)."""
        return [norms for _, p, norms in self.calls if p == (part or "encoder")]

    def named(self) -> dict[str, Tensor]:
        """The value norms by tap name (``blocks.3.attn.v``): the last call's of each."""
        return {name: norms for name, _, norms in self.calls}


def observe(engine: Any, taps: Taps, parts: Sequence[str | None] = (None,)) -> Recording:
    """Attach to ``taps`` what records the value norms of every attention call of ``parts``
    (None: the only stack, or the encoder), and return the ``Recording`` they fill in the
    passes run inside ``engine.tapping(taps)``.

    Each layer's ``v`` tap gets an observer: a function that computes the (B, H, S) norms
    with that layer's W^O (``engine.head_outputs(part)``) and returns the values unchanged,
    so the values are never kept (a long input's norms cost (H, S) per layer, not its
    values).

    Raises:
        MeasureError: an attention whose heads do not split W^O (``head_outputs``).
    """
    from ..nn.taps import tap_name

    record = Recording()
    for part in parts:
        heads = engine.part_shape(part).num_heads
        for layer, o_proj in engine.head_outputs(part).items():
            name = tap_name(part, layer, "v")

            def observe(
                v: Tensor, name: str = name, part: str = part or "encoder", o: nn.Module = o_proj, h: int = heads
            ) -> Tensor:
                record.calls.append((name, part, value_norms(v, o, h)))  # v: (B, G, S, D)
                return v

            taps.replace(name, observe)
    return record


@contextmanager
def tapped(engine: Any, parts: Sequence[str | None] = (None,), active: bool = True) -> Iterator[Recording]:
    """Record the value norms of every attention call of ``parts`` (None: the only stack,
    or the encoder) in the passes inside the block, through ``engine.tapping``
    (``observe``). ``active=False`` records nothing (the weight measure), so callers need
    one code path.

    Raises:
        MeasureError: an attention whose heads do not split W^O (``head_outputs``).
    """
    from ..nn.taps import Taps

    if not active:
        yield Recording()
        return
    taps = Taps()
    record = observe(engine, taps, parts)
    with engine.tapping(taps):
        yield record


def per_layer(calls: list[Tensor], layers_run: int, layers: Iterable[int], family: str) -> list[Tensor]:
    """The value norms of ``layers`` from one part's recorded calls (one per layer run).

    Raises:
        MeasureError: the calls do not match the layers: the family computes an attention
            that does not go through a value projection and W^O (facts: reason "norm_split").
    """
    if len(calls) != layers_run:
        raise MeasureError(
            f"the norm measure needs each head's share of the attention output, and the {family!r} "
            f"attention gave {len(calls)} value projections for {layers_run} layers: its output does not split by head",
            hint="show the weights (measure weight) for this model",
            reason=Reason.NORM_SPLIT,
            measure=NORM.name,
        )
    return [calls[layer] for layer in layers]


def attach_seq2seq(out: Seq2SeqOutput, record: Recording, family: str) -> None:
    """Put each part's recorded value norms into an encoder-decoder's output."""
    out.encoder.value_norms = per_layer(
        record.part("encoder"), len(out.encoder.attentions), range(len(out.encoder.attentions)), family
    )
    out.decoder.value_norms = per_layer(
        record.part("decoder"), len(out.decoder.attentions), range(len(out.decoder.attentions)), family
    )
    out.cross_value_norms = per_layer(record.part("cross"), len(out.cross), range(len(out.cross)), family)
