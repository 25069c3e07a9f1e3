"""Gemma 4 text (``gemma4_text``): the Gemma 3 sandwich stack (gemma.py) with these deltas,
each as transformers' ``modeling_gemma4`` computes it.

    Norm(x)    = x · (mean(x²) + eps)^(-1/2) · w    the weight is w itself, not 1 + w; in float32
    scale      1 on q·kᵀ (the q/k norms set the scale)
    v norm     the values pass a norm without weight (per head, over D)
    heads      full_attention layers have their own head dim (``per_layer_config`` /
               ``global_head_dim``) and, with ``attention_k_eq_v``, their own key/value
               head count and no W^V: the keys' projection is the values' too (before the
               k norm; the values then take the v norm)
    RoPE       per layer type; "proportional" on the full layers: the first
               partial_rotary_factor·D/2 frequencies of θ^(-2i/D), the rest 0 (those pairs
               are not rotated)
    KV sharing the last ``num_kv_shared_layers`` layers have no K/V projections: each attends
               with the keys and values of the last earlier layer of its type
    MLP        twice as wide on those layers with ``use_double_wide_mlp``
    MoE block  with ``enable_moe_block`` a routed expert MLP beside the dense one:
               h = N₁(MLP(N(x))) + N₂(Experts(N'(x))), the router reading the layer's input x
    PLE        with ``hidden_size_per_layer_input`` P, per-layer inputs
               p_n = (Norm(W·x₀ / √E)_n + E_ple[ids]_n · √P) / √2 join each layer after its MLP:
               x = x + Norm(W_proj · (GELU(W_gate · x) ⊙ p_n))
    scalar     each layer's output is multiplied by its stored ``layer_scalar``
The LM head's final logit soft-capping acts on logits, which we never compute.
``use_bidirectional_attention`` "vision" is causal on text (no image tokens); "all" is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import Mask, MultiHeadAttention, QKTransform
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from . import llama
from .base import activation
from .fields import given, sequence, text, whole
from .gemma import GemmaConfig, GemmaDecoder
from .llama import LlamaConfig, SwiGLU
from .rope import RopeConfig

MODEL_TYPES = ("gemma4_text",)
PREFIXES = llama.PREFIXES


class Gemma4RMSNorm(nn.Module):
    """x · (mean(x²) + eps)^(-1/2) (· w), in float32: transformers' Gemma 4 norm, pow not rsqrt."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            h = h * self.weight.float()
        return h.type_as(x)


@dataclass(frozen=True)
class Rotary:
    """One layer type's rotation: D, R (the rotated pairs' dims, 2·partial·D/2), θ, factor."""

    head_dim: int
    rotary_dim: int
    theta: float
    factor: float = 1.0


@dataclass(frozen=True)
class Gemma4Config(GemmaConfig):
    head_dims: tuple[int, ...] = ()  # per layer
    kv_heads: tuple[int, ...] = ()  # per layer
    keys_as_values: tuple[bool, ...] = ()  # per layer: no W^V, the keys' projection serves
    kv_source: tuple[int | None, ...] = ()  # per layer: the earlier layer whose K/V it reuses
    layer_types: tuple[str, ...] = ()
    inner_sizes: tuple[int, ...] = ()  # per layer: the dense MLP's width
    experts: int = 0  # 0: no MoE block
    top_k: int = 0
    expert_size: int = 0
    ple_size: int = 0  # P; 0: no per-layer inputs
    ple_vocab: int = 0
    rotaries: tuple[Rotary, ...] = ()  # per layer


class Shared:
    """What a forward pass hands between layers (not a module: no weights): the per-layer
    inputs (B, S, N, P) and each layer type's stored keys and values."""

    def __init__(self) -> None:
        self.ple: Tensor | None = None
        self.kv: dict[str, tuple[Tensor, Tensor]] = {}


class Gemma4Attention(MultiHeadAttention):
    """q/k norms, a weightless v norm, keys as values, or another layer's keys and values."""

    shared: Shared

    def __init__(self, c: Gemma4Config, layer: int, shared: Shared, stores: bool, **options: Any) -> None:
        super().__init__(c.hidden_size, c.num_attention_heads, **options)
        d, eps = self.head_dim, c.rms_norm_eps
        self.q_norm = Gemma4RMSNorm(d, eps)
        self.layer_type, self.shared, self.stores = c.layer_types[layer], shared, stores
        self.kv_layer = c.kv_source[layer]  # read by explain (taps.ScoreTerms)
        self.reuses = self.kv_layer is not None
        if self.reuses:
            self.k_proj = self.v_proj = None  # type: ignore[assignment]
        else:
            self.k_norm = Gemma4RMSNorm(d, eps)
            self.v_norm = Gemma4RMSNorm(d, eps, with_scale=False)
            if c.keys_as_values[layer]:
                self.v_proj = None  # type: ignore[assignment]

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q = self.q_norm(self._split(self.q_proj(query), self.n_heads))  # (B, H, L, D)
        if self.reuses:
            # The keys (before RoPE, which this layer's transform applies alike) and values
            # of the last earlier layer of this type.
            k, v = self.shared.kv[self.layer_type]  # (B, G, S, D) each
            return q, k[:, :, -q.size(2) :], v[:, :, -q.size(2) :]
        raw_k = self._split(self.k_proj(key), self.n_kv_heads)  # (B, G, S, D)
        raw_v = raw_k if self.v_proj is None else self._split(self.v_proj(value), self.n_kv_heads)
        k, v = self.k_norm(raw_k), self.v_norm(raw_v)
        if self.stores:
            self.shared.kv[self.layer_type] = (k, v)
        return q, k, v


class Gemma4Router(nn.Module):
    def __init__(self, c: Gemma4Config) -> None:
        super().__init__()
        e = c.hidden_size
        self.norm = Gemma4RMSNorm(e, c.rms_norm_eps, with_scale=False)
        self.proj = nn.Linear(e, c.experts, bias=False)
        self.scale = nn.Parameter(torch.ones(e))
        self.per_expert_scale = nn.Parameter(torch.ones(c.experts))
        self.root, self.top_k = e**-0.5, c.top_k

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.norm(x) * self.scale * self.root  # (T, E)
        probs = torch.softmax(self.proj(h), dim=-1, dtype=torch.float32)  # (T, X)
        weights, index = torch.topk(probs, k=self.top_k, dim=-1)  # (T, K) each
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[index], index


class Gemma4Experts(nn.Module):
    """Expert e: W_down[e] · (GELU(g) ⊙ u), (g, u) = W_gate_up[e] · x, weighted and summed."""

    def __init__(self, c: Gemma4Config) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(c.experts, 2 * c.expert_size, c.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(c.experts, c.hidden_size, c.expert_size))
        self.act = activation(c.hidden_act)

    def forward(self, x: Tensor, weights: Tensor, index: Tensor) -> Tensor:
        out = torch.zeros_like(x)  # (T, E)
        for expert in range(self.gate_up_proj.size(0)):
            rank, token = torch.where(index.transpose(0, 1) == expert)  # (n,) each, in transformers' order
            if token.numel() == 0:
                continue
            gate, up = nn.functional.linear(x[token], self.gate_up_proj[expert]).chunk(2, dim=-1)
            h = nn.functional.linear(self.act(gate) * up, self.down_proj[expert])
            out.index_add_(0, token, (h * weights[token, rank, None]).to(out.dtype))
        return out


class Gemma4Block(nn.Module):
    shared: Shared
    layer_scalar: Tensor

    def __init__(self, c: Gemma4Config, layer: int, attn: MultiHeadAttention, shared: Shared) -> None:
        super().__init__()
        e, eps = c.hidden_size, c.rms_norm_eps
        norm = lambda: Gemma4RMSNorm(e, eps)  # noqa: E731
        self.attn_norm, self.attn, self.post_attn_norm = norm(), attn, norm()
        self.mlp_norm, self.post_mlp_norm = norm(), norm()
        self.mlp = SwiGLU(e, c.inner_sizes[layer], c.hidden_act)
        self.moe = c.experts > 0
        if self.moe:
            self.router, self.experts = Gemma4Router(c), Gemma4Experts(c)
            self.post_mlp_norm_1, self.post_mlp_norm_2, self.mlp_norm_2 = norm(), norm(), norm()
        self.layer, self.shared = layer, shared
        if c.ple_size:
            self.ple_gate = nn.Linear(e, c.ple_size, bias=False)
            self.ple_proj = nn.Linear(c.ple_size, e, bias=False)
            self.ple_norm = norm()
            self.act = activation(c.hidden_act)
        self.register_buffer("layer_scalar", torch.ones(1))  # transformers' persistent buffer

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        a, weights = self.attn(self.attn_norm(x), mask=mask, qk_transform=qk_transform, request=request)
        x = x + tap("attn_out", self.post_attn_norm(a))
        h = self.mlp(self.mlp_norm(x))  # (B, L, E)
        if self.moe:
            flat = x.reshape(-1, x.size(-1))  # (T, E): the router reads the layer's input
            routed = self.experts(self.mlp_norm_2(flat), *self.router(flat)).reshape(x.shape)
            h = self.post_mlp_norm_1(h) + self.post_mlp_norm_2(routed)
        x = x + tap("mlp_out", self.post_mlp_norm(h))
        if self.shared.ple is not None:
            p = self.shared.ple[:, -x.size(1) :, self.layer]  # (B, L, P): this step's rows
            x = x + self.ple_norm(self.ple_proj(self.act(self.ple_gate(x)) * p))
        return x * self.layer_scalar, weights


class Gemma4Decoder(GemmaDecoder):
    config: Gemma4Config
    shared: Shared

    def __init__(self, c: Gemma4Config) -> None:
        shared = Shared()
        object.__setattr__(self, "shared", shared)
        super().__init__(c)
        if c.ple_size:
            n = c.num_hidden_layers * c.ple_size
            self.ple_tokens = nn.Embedding(c.ple_vocab, n)
            self.ple_projection = nn.Linear(c.hidden_size, n, bias=False)
            self.ple_projection_norm = Gemma4RMSNorm(c.ple_size, c.rms_norm_eps)

    def make_norm(self, dim: int) -> nn.Module:
        return Gemma4RMSNorm(dim, self.config.rms_norm_eps)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        stores = layer in c.kv_source  # the last unshared layer of its type, when one shares
        options = dict(
            n_kv_heads=c.kv_heads[layer], head_dim=c.head_dims[layer], bias=c.qkv_bias, out_bias=c.o_bias, scale=1.0
        )
        return Gemma4Attention(c, layer, self.shared, stores, **options)

    def make_block(self, layer: int) -> nn.Module:
        return Gemma4Block(self.config, layer, self.make_attention(layer), self.shared)

    def embed(self, input_ids: Tensor) -> Tensor:
        c = self.config
        x = super().embed(input_ids)  # (B, S, E), scaled by √E
        self.shared.kv = {}
        if not c.ple_size:
            return x
        self.shared.ple = self.per_layer_inputs(input_ids, x)
        return x

    # Gemma 4 multiplies by 1/√E and 1/√2 as Python numbers; Gemma 3n by buffers in the
    # model's dtype (in bfloat16 the two round apart).
    factors_in_dtype = False

    def per_layer_inputs(self, input_ids: Tensor, x: Tensor) -> Tensor:
        """(B, S, N, P): each token's input to each layer, from its id and its embedding x (B, S, E)."""
        c = self.config
        b, s = input_ids.shape

        def factor(value: float) -> float | Tensor:
            return torch.tensor(value).to(x.dtype) if self.factors_in_dtype else value

        ids = self.ple_tokens(input_ids) * torch.tensor(c.ple_size**0.5).to(x.dtype)  # (B, S, N·P)
        ids = ids.reshape(b, s, c.num_hidden_layers, c.ple_size)
        projected = self.ple_projection(x) * factor(c.hidden_size**-0.5)
        projected = self.ple_projection_norm(projected.reshape(b, s, c.num_hidden_layers, c.ple_size))
        return (projected + ids) * factor(2.0**-0.5)  # (B, S, N, P)

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        length, c = input_ids.size(1), self.config
        tables = {rope: _rotary(rope, length, x) for rope in set(c.rotaries)}
        return [tables[rope] for rope in c.rotaries]


def _rotary(rope: Rotary, length: int, x: Tensor) -> QKTransform:
    """q·cos + rotate_half(q)·sin over the whole head dim, with transformers' Gemma 4 frequencies:
    θ^(-2i/D) for the first R/2 of the D/2 pairs (R = rotary_dim), 0 for the rest, / factor."""
    d, r = rope.head_dim, rope.rotary_dim
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, r, 2, dtype=torch.int64).float() / d))  # (R/2,)
    inv_freq = torch.cat((inv_freq, torch.zeros(d // 2 - r // 2)))
    inv_freq = inv_freq / rope.factor
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq.to(x.device)[None]  # (S, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (S, D)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def rotate(t: Tensor) -> Tensor:
        half = t.size(-1) // 2
        return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

    return lambda q, k: (rotate(q), rotate(k))


def _rope(config: dict[str, Any], kind: str, head_dim: int) -> Rotary:
    params = dict(given(given(config, "rope_parameters", {}), kind, {}))
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "proportional"):
        raise UnsupportedArchitectureError(
            f"rope_type {rope_type!r} is not implemented for 'gemma4_text' by the own engine",
            setting=f"rope_type={rope_type}",
        )
    theta = float(params.get("rope_theta", 10_000.0))
    if rope_type == "default":
        return Rotary(head_dim, head_dim, theta)
    partial = float(params.get("partial_rotary_factor", 1.0))
    return Rotary(head_dim, 2 * int(partial * head_dim // 2), theta, float(params.get("factor", 1.0)))


def kv_sources(types: Sequence[str], shared: int) -> tuple[int | None, ...]:
    """Per layer: None, or for each of the last ``shared`` layers the last earlier layer of
    its type (``layer_types``), whose keys and values it attends with."""
    first = len(types) - shared
    if shared and set(types[:first]) != set(types):
        raise UnsupportedArchitectureError(
            "num_kv_shared_layers leaves a layer type with no layer to share keys and values from",
            setting="num_kv_shared_layers",
        )
    return tuple(None if i < first else max(j for j in range(first) if types[j] == types[i]) for i in range(len(types)))


def build(config: dict[str, Any]) -> Gemma4Decoder:
    # "vision": image tokens see each other both ways; on text (no images) it is causal.
    if config.get("use_bidirectional_attention") not in (None, "vision"):
        raise UnsupportedArchitectureError(
            f"use_bidirectional_attention={config['use_bidirectional_attention']!r} is not implemented "
            "for 'gemma4_text' by the own engine",
            setting="use_bidirectional_attention",
        )
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    head_dim = whole(config, "head_dim", int(config["hidden_size"]) // heads)
    kv = whole(config, "num_key_value_heads", heads)
    types = tuple(sequence(config, "layer_types", ()))
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UnsupportedArchitectureError(
            "gemma4_text needs layer_types of sliding_attention/full_attention, one per layer",
            setting="layer_types",
        )
    k_eq_v = bool(config.get("attention_k_eq_v", False))
    overrides = {int(i): dict(v) for i, v in given(config, "per_layer_config", {}).items()}
    if not overrides:  # transformers' defaults for the full layers when per_layer_config is absent
        full: dict[str, Any] = {"head_dim": int(config.get("global_head_dim", 512))}
        if k_eq_v and config.get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = int(config["num_global_key_value_heads"])
        overrides = {i: full for i, kind in enumerate(types) if kind == "full_attention"}
    head_dims = tuple(int(overrides.get(i, {}).get("head_dim", head_dim)) for i in range(layers))
    kv_heads = tuple(int(overrides.get(i, {}).get("num_key_value_heads", kv)) for i in range(layers))
    source = kv_sources(types, whole(config, "num_kv_shared_layers", 0, low=0))
    inner = whole(config, "intermediate_size", 1)
    wide = bool(config.get("use_double_wide_mlp", False))
    moe = bool(config.get("enable_moe_block", False))
    ple = whole(config, "hidden_size_per_layer_input", 0, low=0)
    ropes = {kind: _rope(config, kind, head_dims[types.index(kind)]) for kind in set(types)}
    fields: dict[str, Any] = {
        "hidden_act": text(config, "hidden_activation", "gelu_pytorch_tanh"),
        "scale": 1.0,
        "head_dim": head_dim,
        "windows": tuple(config.get("sliding_window") if kind == "sliding_attention" else None for kind in types),
        # Placeholders (plain RoPE, unused): Gemma4Decoder rotates by ``rotaries``.
        "ropes": (RopeConfig("default", 10_000.0, 2, int(config.get("max_position_embeddings", 131_072))),) * layers,
    }
    base = LlamaConfig.from_dict(config, **fields)
    return Gemma4Decoder(
        Gemma4Config(
            **{**vars(base), "generation": 3},
            head_dims=head_dims,
            kv_heads=kv_heads,
            keys_as_values=tuple(k_eq_v and kind == "full_attention" for kind in types),
            kv_source=source,
            layer_types=types,
            inner_sizes=tuple(inner * (2 if wide and source[i] is not None else 1) for i in range(layers)),
            experts=whole(config, "num_experts", 0, low=0) if moe else 0,
            top_k=whole(config, "top_k_experts", 0, low=0),
            expert_size=whole(config, "moe_intermediate_size", 0, low=0),
            ple_size=ple,
            ple_vocab=whole(config, "vocab_size_per_layer_input", config["vocab_size"]),
            rotaries=tuple(ropes[kind] for kind in types),
        )
    )


_L = r"layers\.(\d+)\."
RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"embed_tokens_per_layer\.weight", r"ple_tokens.weight"),
    (r"per_layer_model_projection\.weight", r"ple_projection.weight"),
    (r"per_layer_projection_norm\.weight", r"ple_projection_norm.weight"),
    (_L + r"input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (_L + r"self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (_L + r"self_attn\.([qk])_norm\.weight", r"blocks.\1.attn.\2_norm.weight"),
    (_L + r"post_attention_layernorm\.weight", r"blocks.\1.post_attn_norm.weight"),
    (_L + r"pre_feedforward_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (_L + r"post_feedforward_layernorm\.weight", r"blocks.\1.post_mlp_norm.weight"),
    (_L + r"post_feedforward_layernorm_([12])\.weight", r"blocks.\1.post_mlp_norm_\2.weight"),
    (_L + r"pre_feedforward_layernorm_2\.weight", r"blocks.\1.mlp_norm_2.weight"),
    (_L + r"mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
    (_L + r"router\.(proj\.weight|scale|per_expert_scale)", r"blocks.\1.router.\2"),
    (_L + r"experts\.(gate_up_proj|down_proj)", r"blocks.\1.experts.\2"),
    (_L + r"per_layer_input_gate\.weight", r"blocks.\1.ple_gate.weight"),
    (_L + r"per_layer_projection\.weight", r"blocks.\1.ple_proj.weight"),
    (_L + r"post_per_layer_input_norm\.weight", r"blocks.\1.ple_norm.weight"),
    (_L + r"layer_scalar", r"blocks.\1.layer_scalar"),
    (r"norm\.weight", r"final_norm.weight"),
)
