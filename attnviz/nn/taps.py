"""Named taps: the one way into a head, on both engines.

A tap is a named point in the forward pass where a value flows by. It is the identity
unless something is attached to it; attached, it records the value, or replaces it with
a tensor or a function of it, for chosen heads and positions. The names are
TransformerLens's hook points (``blocks.3.attn.hook_z`` there is ``blocks.3.attn.z``
here), one scheme for every family and both engines (the own engine taps its modules;
the hf engine maps the same names onto transformers' modules: engines/hf_taps.py).

Names and shapes (B batch, H query heads, G key/value heads, Q query positions, S key
positions, D head dim, Dv value head dim, E model width)::

    blocks.N.resid_pre        (B, Q, E)   the residual stream entering layer N
    blocks.N.attn.q           (B, H, Q, D)  queries, after the position transform (RoPE)
    blocks.N.attn.k           (B, G, S, D)  keys, after the position transform
    blocks.N.attn.v           (B, G, S, Dv) values
    blocks.N.attn.pattern     (B, H, Q, S)  the weights, every row
    blocks.N.attn.scores      ``ScoreTerms``: what the weights are computed from (q, k,
                                  scale, mask, bias, soft-cap, sinks), no (Q, S) matrix
                                  made (record only; the own engine's modules)
    blocks.N.attn.z           (B, Q, H, Dv) each head's output, before W^O
    blocks.N.attn.out         (B, Q, E)     the attention's output, after W^O (and its bias)
    blocks.N.attn_out         (B, Q, E)   what the attention sub-layer adds to the stream
                                          (after a family's post-attention norm, if any)
    blocks.N.mlp_out          (B, Q, E)   what the MLP sub-layer adds
    blocks.N.resid_post       (B, Q, E)   the residual stream leaving layer N

Gemma 3n's residual stream is A AltUp streams: its ``resid_pre`` and ``resid_post`` are
(B, Q, A, E) on both engines (architectures/gemma3n.py).

An encoder-decoder's encoder is ``blocks.N...`` as above; its decoder is
``decoder.blocks.N...``, whose layers also have the cross-attention
``decoder.blocks.N.cross.{q,k,v,pattern,z,out}`` (k and v from the encoder's output: S is
the source length) and ``decoder.blocks.N.cross_out``. ``tap_name(part, layer, what)``
spells a name from an engine's part (None / "encoder", "decoder", "cross").

``pattern`` holds every weight row, on both engines, whatever rows the caller keeps (the own
engine computes them all in a pass that records or replaces a pattern). Replaced, each
head's output becomes the new weights times its values (head_i = A_i V_i, the eager
formula's last step), on both engines; the family's other steps (a gate, W^O) follow as
they are. The own engine runs the
layers up to the last one a call asks for (``forward(layers=...)``); the taps of the layers
after it are not reached.

Using taps (from Python, on any engine)::

    taps = Taps().record("blocks.0.attn.pattern").replace("blocks.1.attn.z", 0.0, heads=[2])
    with engine.tapping(taps):
        engine.forward(tokens)
    taps["blocks.0.attn.pattern"]         # (1, H, S, S), the last value recorded

Names may hold ``*`` wildcards (``blocks.*.attn.v``). ``heads`` index the tensor's head
axis (for k and v the key/value heads), ``positions`` its position axis (query positions,
or for k and v the key positions; for ``pattern`` its rows); both select the same axes
in a recorded value, in the value's own order. torch + stdlib only.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

# Where each name's head and position axes are: (heads, positions); None = no head axis.
AXES: dict[str, tuple[int | None, int]] = {
    "q": (1, 2),
    "k": (1, 2),
    "v": (1, 2),
    "pattern": (1, 2),
    "scores": (None, 2),
    "z": (2, 1),
    "out": (None, 1),
    "resid_pre": (None, 1),
    "attn_out": (None, 1),
    "cross_out": (None, 1),
    "mlp_out": (None, 1),
    "resid_post": (None, 1),
}
ATTENTION_TAPS = ("q", "k", "v", "pattern", "z", "out", "scores")
LAYER_TAPS = ("resid_pre", "attn_out", "cross_out", "mlp_out", "resid_post")
RECORD_ONLY = ("scores",)

_NAME = re.compile(
    r"(?:decoder\.)?blocks\.(?P<layer>\d+|\*)\."
    r"(?:(?P<role>attn|cross)\.(?P<attn>q|k|v|pattern|z|out|scores|\*)|(?P<tap>resid_pre|attn_out|cross_out|mlp_out|resid_post))"
)

# value (the selected slice) -> its replacement
Function = Callable[[Tensor], Tensor]


def tap_name(part: str | None, layer: int | str, what: str) -> str:
    """The tap ``what`` of layer ``layer`` of an engine's ``part`` (None or "encoder": the
    only stack, or the encoder; "decoder": the decoder's self-attention; "cross": its
    cross-attention). ``what`` is an attention tap (q, k, v, pattern, z, out) or a layer
    tap (resid_pre, attn_out, cross_out, mlp_out, resid_post).

    >>> tap_name(None, 3, "z"), tap_name("cross", 0, "pattern"), tap_name("decoder", 1, "resid_post")
    ('blocks.3.attn.z', 'decoder.blocks.0.cross.pattern', 'decoder.blocks.1.resid_post')
    """
    if part not in (None, "encoder", "decoder", "cross"):
        raise ValueError(f"unknown part {part!r}")
    stack = "decoder.blocks" if part in ("decoder", "cross") else "blocks"
    if what in LAYER_TAPS:
        return f"{stack}.{layer}.{what}"
    if what not in ATTENTION_TAPS:
        raise ValueError(f"unknown tap {what!r} (taps: {', '.join(ATTENTION_TAPS + LAYER_TAPS)})")
    return f"{stack}.{layer}.{'cross' if part == 'cross' else 'attn'}.{what}"


def kind_of(name: str) -> str:
    """The last part of a tap name: q, k, v, pattern, z, out or a layer tap."""
    return name.rsplit(".", 1)[-1]


def check_name(name: str) -> None:
    """Raise ValueError unless ``name`` (wildcards allowed) follows the scheme above."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a tap name (e.g. 'blocks.0.attn.z', 'blocks.*.resid_post', "
            "'decoder.blocks.1.cross.pattern')"
        )


def attention_layer(name: str) -> int | None:
    """The layer number of a self-attention tap of the one stack or the encoder
    (``blocks.N.attn.*``); None for any other name or a wildcard layer."""
    match = _NAME.fullmatch(name)
    if match is None or match["role"] != "attn" or match["layer"] == "*" or name.startswith("decoder."):
        return None
    return int(match["layer"])


def check_names(taps: Taps, stacks: dict[str, int]) -> None:
    """Raise ValueError unless every name attached to ``taps`` names a layer the model has.

    Args:
        stacks: layers per stack prefix: {"blocks": N} for one stack, plus
            {"decoder.blocks": M} for an encoder-decoder.
    """
    for pattern in taps.patterns:
        match = _NAME.fullmatch(pattern)
        if match is None:  # pragma: no cover - Taps checks every name it takes
            check_name(pattern)
            continue
        stack = "decoder.blocks" if pattern.startswith("decoder.") else "blocks"
        if stack not in stacks:
            raise ValueError(f"{pattern!r}: this model has no decoder (its taps: blocks.N...)")
        if stack == "blocks" and (match["role"] == "cross" or match["tap"] == "cross_out"):
            raise ValueError(f"{pattern!r}: cross-attention is the decoder's (decoder.blocks.N.cross...)")
        layer = match["layer"]
        if layer != "*" and int(layer) >= stacks[stack]:
            raise ValueError(f"{pattern!r}: layer {layer} is out of range ({stack}.0 to {stack}.{stacks[stack] - 1})")


def _index(value: Tensor, kind: str, heads: Sequence[int] | None, positions: Sequence[int] | None) -> tuple:
    """The index selecting ``heads`` and ``positions`` of a ``kind`` value, keeping its axes."""
    head_axis, pos_axis = AXES[kind]
    index: list[object] = [slice(None)] * value.dim()
    picks = []
    if heads is not None:
        if head_axis is None:
            raise ValueError(f"the {kind} tap has no head axis")
        picks.append((head_axis, torch.as_tensor(list(heads), dtype=torch.long, device=value.device)))
    if positions is not None:
        picks.append((pos_axis, torch.as_tensor(list(positions), dtype=torch.long, device=value.device)))
    picks.sort(key=lambda pick: pick[0])
    if len(picks) == 2:  # two neighbouring axes: broadcast (n, 1) against (1, m), an outer product
        (a, first), (b, second) = picks
        index[a], index[b] = first[:, None], second[None, :]
    elif picks:
        index[picks[0][0]] = picks[0][1]
    return tuple(index)


@dataclass(frozen=True)
class Hook:
    """One attachment: record, or replace by ``value`` (a tensor, a number, or a function
    of the selected slice); for ``heads`` and ``positions`` (None: all)."""

    pattern: str
    action: str  # "record" or "replace"
    value: Tensor | float | Function | None = None
    heads: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None


@dataclass
class Taps:
    """Taps attached for one or more passes, and what they recorded.

    Build with ``record`` and ``replace`` (each returns the Taps, so calls chain), run the
    passes inside ``engine.tapping(taps)``, read ``taps[name]`` (the last value recorded
    under a name) or ``taps.recorded[name]`` (every one, in call order): a tensor, or for
    ``scores`` a ``ScoreTerms``.
    """

    hooks: list[Hook] = field(default_factory=list)
    recorded: dict[str, list[Any]] = field(default_factory=dict)
    _cache: dict[str, list[Hook]] = field(default_factory=dict, repr=False)
    # the concrete names a pass reached with something attached (``never_reached``)
    reached: set[str] = field(default_factory=set, repr=False)

    def record(self, name: str, *, heads: Sequence[int] | None = None, positions: Sequence[int] | None = None) -> Taps:
        """Keep a copy of the value at ``name`` (of ``heads`` and ``positions``) at each call."""
        return self._add(Hook(name, "record", None, _tuple(heads), _tuple(positions)))

    def replace(
        self,
        name: str,
        value: Tensor | float | Function,
        *,
        heads: Sequence[int] | None = None,
        positions: Sequence[int] | None = None,
    ) -> Taps:
        """Replace the value at ``name``: its slice of ``heads`` and ``positions`` (None:
        all) becomes ``value`` (a tensor broadcastable to the slice, or a number), or
        ``value(slice)``. Without heads and positions, a function may return a value of
        another shape that the model accepts (a batch of copies, say). A replaced
        ``pattern`` makes each head's output its new weights times its values; ``scores``
        is record-only (the terms the weights are computed from, read beside the pass)."""
        if kind_of(name) in RECORD_ONLY:
            raise ValueError(f"{name!r} can be recorded, not replaced (its terms are read beside the pass)")
        return self._add(Hook(name, "replace", value, _tuple(heads), _tuple(positions)))

    def _add(self, hook: Hook) -> Taps:
        check_name(hook.pattern)
        kind = kind_of(hook.pattern)
        if hook.heads is not None and kind != "*" and AXES[kind][0] is None:
            raise ValueError(f"the {kind} tap has no head axis: heads cannot be chosen")
        if kind == "scores" and hook.positions is not None:
            raise ValueError("the scores tap records the terms whole: positions cannot be chosen")
        self.hooks.append(hook)
        self._cache.clear()
        return self

    @property
    def patterns(self) -> list[str]:
        """The names (wildcards included) something is attached to."""
        return [hook.pattern for hook in self.hooks]

    @property
    def records_pattern(self) -> bool:
        """Whether a ``pattern`` is recorded or replaced (the own engine then computes every weight row)."""
        return any(kind_of(hook.pattern) in ("pattern", "*") for hook in self.hooks)

    def __getitem__(self, name: str) -> Any:
        values = self.recorded.get(name)
        if not values:
            attached = ", ".join(sorted({h.pattern for h in self.hooks if h.action == "record"})) or "none"
            raise KeyError(f"nothing was recorded at {name!r} (recording: {attached})")
        return values[-1]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self.recorded.get(name))

    def attached(self, name: str) -> list[Hook]:
        """The hooks whose name matches ``name`` (a concrete name), in attachment order."""
        found = self._cache.get(name)
        if found is None:
            found = self._cache[name] = [h for h in self.hooks if fnmatch.fnmatchcase(name, h.pattern)]
        return found

    def wants(self, name: str) -> bool:
        return bool(self.attached(name))

    def never_reached(self) -> list[str]:
        """The names attached (wildcards included) that no pass has reached: an engine
        checks them after its passes, so that a tap its model's code bypasses is refused,
        never an empty record or a replacement that changed nothing."""
        return [
            pattern
            for pattern in dict.fromkeys(self.patterns)
            if not any(fnmatch.fnmatchcase(name, pattern) for name in self.reached)
        ]

    def apply(self, name: str, value: Tensor) -> Tensor:
        """The value at ``name`` after every hook attached there: records taken, replacements made."""
        kind = kind_of(name)
        hooks = self.attached(name)
        if hooks:
            self.reached.add(name)
        for hook in hooks:
            if hook.action == "record":
                index = _index(value, kind, hook.heads, hook.positions)
                self.recorded.setdefault(name, []).append(value[index].detach().clone())
                continue
            if hook.heads is None and hook.positions is None and callable(hook.value):
                value = hook.value(value)
                continue
            index = _index(value, kind, hook.heads, hook.positions)
            new = hook.value(value[index]) if callable(hook.value) else hook.value
            if new is None:
                raise ValueError(f"a replacement at {name!r} gave None")
            value = value.clone()  # the model's tensor may be used again (a residual, a cache)
            value[index] = new.to(value) if isinstance(new, Tensor) else new
        return value


def _tuple(values: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(int(v) for v in values)


@dataclass(frozen=True)
class ScoreTerms:
    """What one attention call computes its weights from, as the module hands them to its
    attention function: the ``scores`` tap's value. Nothing (Q, S)-sized is made: the
    weights of any rows are ``rows.attention_rows(q, k, rows, mask, scale)`` where
    ``plain`` (kept rows), and explain writes every step out from these terms.

    Attributes:
        q: (B, H, Q, D) queries, k: (B, G, S, D) keys, as the scores use them (after the
            position transform and any q/k norm; k with a generation's stored keys).
        mask: the module's mask (``attention.Mask``, a boolean tensor, or None).
        scale: the factor on q·kᵀ (None: 1/√D).
        score_bias: added to the scaled scores (T5's position bias, ALiBi's), or None.
        softcap: logit soft-capping (Gemma 2), or None. sinks: (H,) sink logits, or None.
        fused: the call's request computes the output by the fused kernel.
        transformed: a position transform (RoPE) was applied to q and k.
        normed: q and k are normed per head first (the module has ``q_norm``).
        alibi: the bias is the module's own ALiBi (``slope · key position``).
        kv_layer: the earlier layer whose keys and values the module attends with (a
            Gemma 3n/4 layer sharing them: the module's ``kv_layer``), or None: its own.
    """

    q: Tensor
    k: Tensor
    mask: Any
    scale: float | None
    score_bias: Tensor | None
    softcap: float | None
    sinks: Tensor | None
    fused: bool
    transformed: bool
    normed: bool
    alibi: bool
    kv_layer: int | None = None

    @property
    def plain(self) -> bool:
        """softmax(q·kᵀ·scale), masked, and nothing else, from one text by the fused
        kernel: ``attention_rows`` then gives the very rows the call gave."""
        modifiers = (self.score_bias, self.softcap, self.sinks)
        return self.fused and all(m is None for m in modifiers) and self.q.size(0) == 1


def replaced_pattern(weights: Tensor, q: Tensor, v: Tensor) -> Tensor:
    """Each head's output (B, H, L, Dv) from a replaced pattern ``weights`` (B, H, L, S) and
    the values v (B, G, S, Dv): head_i = A_i V_i, the eager formula's last step (a tap's
    replacement of ``pattern``: what the head carries, read through other weights); with
    grouped-query attention each key/value head serves H/G query heads.

    Raises:
        ValueError: ``weights`` does not hold every query row (a pass that kept some rows).
    """
    if weights.size(-2) != q.size(-2):
        raise ValueError(f"a replaced pattern needs every query row: {weights.size(-2)} of {q.size(-2)}")
    v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)  # (B, H, S, Dv)
    return torch.matmul(weights.to(v.dtype), v)


class Site:
    """Where a running pass is: the taps attached and the current layer's name prefix
    (``blocks.3``), set by the layer loop (architectures/base.py ``layer_loop``)."""

    def __init__(self, taps: Taps) -> None:
        self.taps = taps
        self.layer = ""

    def __call__(self, what: str, value: Tensor) -> Tensor:
        """Tap ``what`` ("attn.z", "resid_post", ...) of the current layer."""
        return self.taps.apply(f"{self.layer}.{what}", value)

    def pattern(self, role: str, heads: Tensor, weights: Tensor, q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The ``pattern`` tap of attention ``role``: (heads (B, H, L, Dv), weights (B, H, L, S))
        as they were, or with the pattern replaced, each head's output recomputed from it."""
        patched = self(f"{role}.pattern", weights)
        return (heads, weights) if patched is weights else (replaced_pattern(patched, q, v), patched)

    def terms(
        self, module: Any, q: Tensor, k: Tensor, mask: Any, score_bias: Tensor | None, request: Any, transform: Any
    ) -> None:
        """Record the ``scores`` tap of ``module`` (a ``MultiHeadAttention``, read for its
        scale, soft-cap, sinks, q/k norm and ALiBi) if anything is attached to it: the
        inputs of its attention function ``request``, after the position ``transform``."""
        name = f"{self.layer}.{module.tap_role}.scores"
        if not self.taps.wants(name):
            return
        terms = ScoreTerms(
            q, k, mask, module.scale, score_bias, module.softcap, module.sinks,
            fused=bool(getattr(request, "fused", False)), transformed=transform is not None,
            normed=hasattr(module, "q_norm"), alibi=hasattr(module, "alibi"),
            kv_layer=getattr(module, "kv_layer", None),
        )  # fmt: skip
        self.taps.reached.add(name)
        self.taps.recorded.setdefault(name, []).append(terms)


_ACTIVE: contextvars.ContextVar[Site | None] = contextvars.ContextVar("attnviz_taps", default=None)


def active() -> Site | None:
    """The running pass's taps, or None (then every tap is the identity, at the cost of this call)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def attached(taps: Taps) -> Iterator[Taps]:
    """Inside the block, our own modules (``MultiHeadAttention`` and the layer loop) apply
    ``taps``. Engines wrap this in ``Engine.tapping``; an analysis never calls it directly."""
    token = _ACTIVE.set(Site(taps))
    try:
        yield taps
    finally:
        _ACTIVE.reset(token)


def tap(what: str, value: Tensor) -> Tensor:
    """``value`` through the current layer's tap ``what`` ("attn_out", "mlp_out", ...): the
    identity when no taps are attached. For blocks; attention modules use ``active()``."""
    site = _ACTIVE.get()
    return value if site is None else site(what, value)
