"""Rotary position embeddings (RoPE) and their scaled variants, as transformers 5 reads
them from a config's ``rope_parameters``.

    RoPE rotates each (i, i + R/2) pair of the first R dims of q and k (R = the rotary
    dim, D unless ``partial_rotary_factor`` < 1) by the angle position · inv_freq[i]:

        q' = q·cos + rotate_half(q)·sin,   cos/sin = cos/sin(angles) · attention_factor

    with the plain inverse frequencies inv_freq[i] = θ^(-2i/R). The variants change
    inv_freq (and some the factor on cos/sin):

    linear    inv_freq / factor                                   (position interpolation)
    dynamic   θ grown to θ·(factor·S/M - (factor-1))^(R/(R-2)) once S > M  (NTK-aware;
              S the sequence length, M max_position_embeddings)
    yarn      a ramp between interpolated (/factor) and original frequencies over the
              dims between beta_fast and beta_slow rotations; cos/sin · 0.1·ln(factor)+1
    longrope  inv_freq / short_factor[i], or / long_factor[i] once S exceeds
              original_max_position_embeddings; cos/sin · √(1 + ln(factor)/ln(M_orig))
    llama3    low frequencies / factor, high ones kept, a smooth blend in between

Each formula follows transformers' ``modeling_rope_utils`` step by step (same dtypes,
same order of operations), so the angles are bit-identical to its own.

Where transformers' dynamic RoPE keeps state between calls (it only grows θ and never
shrinks it back until the input is shorter than M), ours is a function of the current
input alone: the two agree on every single forward pass of a freshly loaded model and
on any sequence of growing lengths.

torch only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..errors import UnsupportedArchitectureError
from ..nn.attention import QKTransform
from .fields import fraction, given, number, whole

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """Everything the rotary angles depend on.

    Attributes:
        rotary_dim: R, the leading dims of each head that rotate (D, or less with a
            ``partial_rotary_factor``; an odd R rotates R + 1, see ``pairs``); the rest
            pass through unchanged.
        max_position_embeddings: M, the model's context length (dynamic and longrope
            compare the input length with it or with ``original_max_position_embeddings``).
    """

    rope_type: str
    theta: float
    rotary_dim: int
    max_position_embeddings: int
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedArchitectureError(
                f"rope_parameters.rope_type={self.rope_type!r} is not implemented by the own engine "
                f"(it implements: {', '.join(ROPE_TYPES)})",
                setting=f"rope_type={self.rope_type}",
            )
        if self.rotary_dim < 1:
            raise ValueError(f"rotary dim {self.rotary_dim} must be at least 1")
        if self.rope_type == "dynamic" and self.rotary_dim == 2:
            # dynamic grows θ by a power of R/(R-2).
            raise ValueError("rope_type 'dynamic' needs a rotary dim above 2 (it divides by R - 2)")
        if self.rope_type == "yarn" and self.theta == 1.0:
            raise ValueError("rope_theta is 1; rope_type 'yarn' divides by ln(rope_theta)")
        needs: dict[str, tuple[str, ...]] = {
            "linear": ("factor",),
            "dynamic": ("factor",),
            "yarn": ("original_max_position_embeddings",),
            "longrope": ("original_max_position_embeddings", "short_factor", "long_factor"),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        }
        for name in needs.get(self.rope_type, ()):
            if getattr(self, name) is None:
                raise ValueError(f"rope_parameters with rope_type {self.rope_type!r} lack {name!r}")
        for name in ("short_factor", "long_factor"):
            values = getattr(self, name)
            if values is not None and len(values) != self.pairs:
                raise ValueError(f"rope_parameters.{name} has {len(values)} entries, not one per pair: {self.pairs}")

    @property
    def pairs(self) -> int:
        """How many (i, i + R'/2) pairs rotate: ⌈R/2⌉. An odd R (Phi-3 at 0.75 × head_dim
        10 = 7) rotates R + 1 dims, as transformers does: its frequencies are
        θ^(-2i/R) for i < ⌈R/2⌉, and it rotates as many dims as cos/sin are wide."""
        return (self.rotary_dim + 1) // 2

    def frequencies(self, length: int) -> tuple[Tensor, float]:
        """inv_freq (R/2,) in float32 on the CPU, and the factor on cos/sin, for an input of ``length`` tokens."""
        return _INV_FREQ[self.rope_type](self, length)

    def cos_sin(self, length: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin (S, R) for positions 0..length-1, in ``like``'s dtype and device."""
        inv_freq, scaling = self.frequencies(length)
        # Angle of every (position, frequency), in float32 as transformers computes it;
        # both halves of the rotated dims share the angles.
        positions = torch.arange(length, device=like.device).float()  # (S,)
        freqs = positions[:, None] * inv_freq.to(device=like.device, dtype=torch.float)  # (S, R/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (S, R)
        return (angles.cos() * scaling).to(like.dtype), (angles.sin() * scaling).to(like.dtype)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first R dims of ``x`` (..., S, D) by cos/sin (S, R); the other D - R pass through."""
    rotary_dim = cos.size(-1)
    if rotary_dim == x.size(-1):
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


def rotary(rope: RopeConfig, length: int, like: Tensor, in_float32: bool = False) -> QKTransform:
    """The RoPE q/k transform for positions 0..length-1, in ``like``'s dtype and device.

    ``in_float32``: keep cos/sin in float32 and rotate in float32, casting the result
    back (OLMo 2); the same in a float32 model, closer to transformers in half precision.
    """
    cos, sin = rope.cos_sin(length, like.float() if in_float32 else like)  # (S, R)

    def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        # Broadcast over (B, H) / (B, G).
        q_rot, k_rot = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # (B, H, L, D), (B, G, S, D)
        return q_rot.to(q.dtype), k_rot.to(k.dtype)

    return apply


# --- reading a config ----------------------------------------------------------


def rope_parameters(config: Mapping[str, Any], layer_type: str | None = None) -> dict[str, Any]:
    """The rope parameters of ``config`` (of ``layer_type`` when they are given per layer type).

    transformers 5 writes ``rope_parameters: {rope_type, rope_theta, ...}`` (or one such
    dict per layer type, Gemma 3); older configs have top-level ``rope_theta`` and
    ``rope_scaling: {type, factor, ...}``.
    """
    params: Any = config.get("rope_parameters")
    if not params:  # absent, null or {}: transformers 5 then reads the older rope_scaling
        params = given(config, "rope_scaling", {})
    if not isinstance(params, Mapping):
        raise ValueError(f"rope_parameters is {params!r}, not a mapping")
    nested = any(isinstance(v, Mapping) for v in params.values())
    if nested:
        if layer_type is None:
            raise UnsupportedArchitectureError(
                f"per-layer-type rope_parameters ({', '.join(sorted(params))}) are not implemented "
                f"for model_type {config.get('model_type')!r} by the own engine",
                setting="rope_parameters",
            )
        params = given(params, layer_type, {})
        if not isinstance(params, Mapping):
            raise ValueError(f"rope_parameters.{layer_type} is {params!r}, not a mapping")
    return dict(params)


def rope_config(
    config: Mapping[str, Any],
    head_dim: int,
    *,
    layer_type: str | None = None,
    partial_rotary: bool = False,
    default_theta: float = 10000.0,
    aliases: Mapping[str, str] | None = None,
) -> RopeConfig:
    """A family's ``RopeConfig`` from its config.json, read as transformers 5 reads it.

    Args:
        head_dim: D, the width of each head's q and k.
        layer_type: which entry of per-layer-type rope parameters (Gemma 3).
        partial_rotary: whether the family rotates only the first
            ``partial_rotary_factor``·D dims (Phi-3); families that do not must refuse
            a factor other than 1, whose meaning transformers would change.
        aliases: old rope_type names the family maps to new ones (Phi-3: su, yarn -> longrope).

    Raises:
        UnsupportedArchitectureError: a rope_type or setting the own engine does not implement.
        ValueError: parameters the rope_type needs are missing.
    """
    params = rope_parameters(config, layer_type)
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    rope_type = (aliases or {}).get(rope_type, rope_type)
    # A key inside rope_parameters wins over the top-level one; either may be absent or
    # null (unset), but a 0 is a 0 and is checked, never read as "unset".
    theta = number(params, "rope_theta", given(config, "rope_theta", default_theta), above=0.0)
    partial = fraction(params, "partial_rotary_factor", given(config, "partial_rotary_factor", 1.0))
    if partial != 1.0 and not partial_rotary:
        raise UnsupportedArchitectureError(
            f"partial_rotary_factor={partial} is not implemented for model_type {config.get('model_type')!r} "
            "by the own engine",
            setting=f"partial_rotary_factor={partial}",
        )
    rotary_dim = int(head_dim * partial)
    # An odd R rotates R + 1 dims, as transformers does (``RopeConfig.pairs``): they must fit the head.
    if rotary_dim < 1 or rotary_dim + rotary_dim % 2 > head_dim:
        raise ValueError(
            f"partial_rotary_factor {partial} of the head dim {head_dim} gives a rotary dim of {rotary_dim}; "
            f"it must be at least 1, and rounded up to even at most the head dim"
        )
    max_positions = whole(config, "max_position_embeddings", 2048)
    original = None
    if rope_type in ("llama3", "yarn", "longrope"):
        # transformers gives a top-level original_max_position_embeddings (Phi-3 saves one)
        # priority over the one inside rope_parameters.
        inner = whole(
            params, "original_max_position_embeddings", max_positions, low=2 if rope_type == "longrope" else 1
        )
        original = whole(config, "original_max_position_embeddings", inner, low=2 if rope_type == "longrope" else 1)
    for key in ("factor", "low_freq_factor", "high_freq_factor", "attention_factor"):
        if params.get(key) is not None:
            # Each is a divisor or a scale of cos/sin: 0 or below gives inf or a dead rotation.
            number(params, key, 1.0, above=0.0, name=f"rope_parameters.{key}")
    low, high = params.get("low_freq_factor"), params.get("high_freq_factor")
    if rope_type == "llama3" and low is not None and high is not None and float(high) <= float(low):
        raise ValueError(
            f"rope_parameters.high_freq_factor {high} must be above low_freq_factor {low} "
            "(llama3 divides by their difference)"
        )

    def opt(name: str) -> float | None:
        value = params.get(name)
        return None if value is None else float(value)

    def factors(name: str) -> tuple[float, ...] | None:
        value = params.get(name)
        return None if value is None else tuple(float(v) for v in value)

    return RopeConfig(
        rope_type=rope_type,
        theta=theta,
        rotary_dim=rotary_dim,
        max_position_embeddings=max_positions,
        factor=opt("factor"),
        original_max_position_embeddings=original,
        attention_factor=opt("attention_factor"),
        beta_fast=opt("beta_fast"),
        beta_slow=opt("beta_slow"),
        mscale=opt("mscale"),
        mscale_all_dim=opt("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
        low_freq_factor=opt("low_freq_factor"),
        high_freq_factor=opt("high_freq_factor"),
        short_factor=factors("short_factor"),
        long_factor=factors("long_factor"),
    )


# --- the inverse frequencies of each rope_type -----------------------------------


def _exponents(dim: int) -> Tensor:
    """2i/R for i = 0..R/2-1, float32."""
    return torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # (R/2,)


def _default(rope: RopeConfig, length: int) -> tuple[Tensor, float]:
    return 1.0 / (rope.theta ** _exponents(rope.rotary_dim)), 1.0


def _linear(rope: RopeConfig, length: int) -> tuple[Tensor, float]:
    assert rope.factor is not None  # checked in __post_init__
    inv_freq = 1.0 / (rope.theta ** _exponents(rope.rotary_dim))
    return inv_freq / rope.factor, 1.0


def _dynamic(rope: RopeConfig, length: int) -> tuple[Tensor, float]:
    assert rope.factor is not None
    m, dim = rope.max_position_embeddings, rope.rotary_dim
    if length <= m:
        # transformers keeps the frequencies computed for M, where the growth term is 1.
        base: float | Tensor = rope.theta * ((rope.factor * m / m) - (rope.factor - 1)) ** (dim / (dim - 2))
    else:
        # Grown for this length; transformers computes it from a tensor length, in float32.
        seq_len = torch.tensor(length, dtype=torch.int64)
        base = rope.theta * ((rope.factor * seq_len / m) - (rope.factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** _exponents(dim)), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(rope: RopeConfig, length: int) -> tuple[Tensor, float]:
    assert rope.original_max_position_embeddings is not None
    dim, base, original = rope.rotary_dim, rope.theta, rope.original_max_position_embeddings
    factor = rope.factor if rope.factor is not None else rope.max_position_embeddings / original
    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, rope.mscale) / _yarn_mscale(factor, rope.mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    # transformers reads a 0 here as unset (``get("beta_fast") or 32``): the same, on purpose.
    beta_fast = 32.0 if not rope.beta_fast else rope.beta_fast
    beta_slow = 1.0 if not rope.beta_slow else rope.beta_slow

    def correction_dim(rotations: float) -> float:
        # The dim whose wavelength makes ``rotations`` turns over the original context.
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)  # (R/2,)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)  # (R/2,)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1: original frequency (high), 0: interpolated (low)
    return interpolation * (1 - keep) + extrapolation * keep, attention_factor


def _longrope(rope: RopeConfig, length: int) -> tuple[Tensor, float]:
    assert rope.original_max_position_embeddings is not None
    assert rope.short_factor is not None and rope.long_factor is not None
    original = rope.original_max_position_embeddings
    factor = rope.factor if rope.factor is not None else rope.max_position_embeddings / original
    attention_factor = rope.attention_factor
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = torch.tensor(rope.long_factor if length > original else rope.short_factor, dtype=torch.float32)  # (R/2,)
    return 1.0 / (ext * rope.theta ** _exponents(rope.rotary_dim)), attention_factor


def _llama3(rope: RopeConfig, length: int) -> tuple[Tensor, float]:
    assert rope.factor is not None and rope.low_freq_factor is not None and rope.high_freq_factor is not None
    assert rope.original_max_position_embeddings is not None
    inv_freq = 1.0 / (rope.theta ** _exponents(rope.rotary_dim))  # (R/2,)
    factor, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    old_context = rope.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    # Wavelengths longer than the old context: interpolated; shorter than old/high: kept.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


_INV_FREQ = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "llama3": _llama3,
}
