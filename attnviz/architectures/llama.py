"""The Llama family (Llama, Mistral, Qwen2): a causal pre-RMSNorm decoder with
rotary position embeddings, grouped-query attention and a SwiGLU MLP.

    RMSNorm(x)  = x / √(mean(x²) + eps) · w           (computed in float32)
    RoPE        rotates each (i, i + D/2) pair of q and k by position · inv_freq[i]
                (plain θ^(-2i/D), or a scaled variant: llama3, linear, dynamic,
                yarn, longrope; see rope.py)
    GQA         H query heads share G key/value heads, H/G query heads per group
    MLP(x)      = W_down · (SiLU(W_gate · x) ⊙ W_up · x)

Where the members differ:
    llama    attention_bias (q/k/v/o), mlp_bias, head_dim may differ from E/H
    mistral  no biases; sliding-window attention (each token sees its last
             ``sliding_window`` tokens) when ``sliding_window`` is set
    qwen2    q/k/v biases, no o bias; sliding window only with
             ``use_sliding_window``, on the layers ``layer_types`` names

``LlamaDecoder`` is also the base of the later rotary families (qwen3, olmo2, phi3,
gemma*, mixtral, qwen3_moe, gpt_oss): they override ``make_attention``, ``make_mlp``,
``make_block``, ``make_norm`` or ``embed`` and keep the rest.

Rotary cos/sin are computed in the forward pass, not kept as buffers: models are
built on the meta device and filled from the checkpoint, which holds no cos/sin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import MultiHeadAttention, QKTransform
from .base import activation, config_value
from .decoder import DecoderModel, PreNormBlock
from .fields import sequence, whole
from .rope import RopeConfig, rope_config, rotary

MODEL_TYPES = ("llama", "mistral", "qwen2")
PREFIXES = ("model.",)


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    ropes: tuple[RopeConfig, ...]  # per layer (Gemma 3 gives local and global layers different ones)
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    windows: tuple[int | None, ...] = ()  # per layer: sliding window, or None
    scale: float | None = None  # the factor on q·kᵀ; None: 1/√head_dim
    softcap: float | None = None  # attention logit soft-capping (Gemma 2)
    sinks: bool = False  # learned per-head attention sink logits (GPT-OSS)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if len(self.windows) != self.num_hidden_layers:
            raise ValueError(f"{len(self.windows)} sliding windows for {self.num_hidden_layers} layers")
        if len(self.ropes) != self.num_hidden_layers:
            raise ValueError(f"{len(self.ropes)} rotary settings for {self.num_hidden_layers} layers")
        if self.softcap is not None and self.softcap <= 0:
            raise ValueError(f"attn_logit_softcapping={self.softcap} must be positive")

    @property
    def rope(self) -> RopeConfig:
        """The rotary setting of layer 0 (of every layer, in most families)."""
        return self.ropes[0]

    @classmethod
    def from_dict(cls, config: dict[str, Any], **overrides: Any) -> LlamaConfig:
        """The fields every rotary family shares, read from config.json; ``overrides``
        replace any of them (a family's own biases, windows, scale, ...)."""
        model_type = config.get("model_type", "llama")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        head_dim = int(config_value(config, "head_dim", default=hidden // heads))
        if model_type == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        elif model_type == "mistral":
            qkv_bias = o_bias = mlp_bias = False
        else:
            qkv_bias = o_bias = bool(config.get("attention_bias", False))
            mlp_bias = bool(config.get("mlp_bias", False))
        fields: dict[str, Any] = dict(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(config_value(config, "num_key_value_heads", default=heads)),
            head_dim=head_dim,
            max_position_embeddings=int(config_value(config, "max_position_embeddings", default=2048)),
            rms_norm_eps=float(config_value(config, "rms_norm_eps", default=1e-6)),
            hidden_act=str(config_value(config, "hidden_act", default="silu")),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=mlp_bias,
        )
        fields.update(overrides)
        if "windows" not in fields:
            fields["windows"] = sliding_windows(config, model_type, layers)
        if "ropes" not in fields:
            fields["ropes"] = (rope_config(config, head_dim),) * layers
        return cls(**fields)


def sliding_windows(config: dict[str, Any], model_type: str, layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window, as transformers' families choose it.

    mistral, mixtral, phi3: ``sliding_window`` on every layer (None: full attention).
    qwen3_moe: likewise, but only with ``use_sliding_window``.
    qwen2, qwen3: only with ``use_sliding_window``, on the layers ``layer_types`` names
    (by default those from ``max_window_layers`` on).
    gemma2, gemma3_text, gpt_oss: on the ``sliding_attention`` layers of ``layer_types``
    (by default every other layer from layer 0; Gemma 3 all but every
    ``sliding_window_pattern``-th, 6 by default).
    """
    window = config.get("sliding_window")
    if model_type in ("mistral", "mixtral", "phi3"):
        return (window,) * layers  # None in the config means full causal attention
    if model_type == "qwen3_moe":
        # transformers' Qwen3-MoE reads neither layer_types nor max_window_layers.
        return (window if config.get("use_sliding_window") else None,) * layers
    if model_type in ("qwen2", "qwen3"):
        if not config.get("use_sliding_window") or window is None:
            return (None,) * layers
        first = int(config.get("max_window_layers", 28))
        types = sequence(
            config, "layer_types", ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
        )
        return _windows_of(types, window, model_type, layers)
    if model_type in ("gemma2", "gemma3_text", "gpt_oss"):
        types = sequence(config, "layer_types", default_layer_types(config, model_type, layers))
        return _windows_of(types, window, model_type, layers)
    types = sequence(config, "layer_types", ())
    if types and any(kind != "full_attention" for kind in types):
        raise UnsupportedArchitectureError(
            f"layer_types other than full_attention are not implemented for {model_type!r} by the own engine",
            setting="layer_types",
        )
    return (None,) * layers


def default_layer_types(config: dict[str, Any], model_type: str, layers: int) -> list[str]:
    """``layer_types`` as transformers fills it in for configs that lack it (older ones)."""
    period = whole(config, "sliding_window_pattern", 6) if model_type == "gemma3_text" else 2
    return ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers)]


def _windows_of(types: Sequence[str], window: int | None, model_type: str, layers: int) -> tuple[int | None, ...]:
    if len(types) != layers:
        raise ValueError(f"layer_types names {len(types)} layers, num_hidden_layers is {layers}")
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise UnsupportedArchitectureError(
            f"layer_types {', '.join(map(repr, unknown))} are not implemented for {model_type!r} by the own engine",
            setting="layer_types",
        )
    return tuple(window if kind == "sliding_attention" else None for kind in types)


class RMSNorm(nn.Module):
    """x / √(mean(x²) + eps) · w. ``weight_in_float32``: multiply by w before casting back
    to the model's dtype, as OLMo 2 and GPT-OSS do (Llama casts first); the same in float32."""

    def __init__(self, dim: int, eps: float, weight_in_float32: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.weight_in_float32 = eps, weight_in_float32

    def forward(self, x: Tensor) -> Tensor:
        # In float32 whatever the model's dtype, as transformers does: mean(x²) of
        # half-precision activations overflows and loses digits.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_in_float32:
            return (self.weight * h).to(x.dtype)
        return self.weight * h.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inner: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, inner, bias=bias)
        self.up = nn.Linear(hidden, inner, bias=bias)
        self.down = nn.Linear(inner, hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))


def attention_options(c: LlamaConfig) -> dict[str, Any]:
    """``MultiHeadAttention``'s keyword arguments for a config of this family and of the
    families built on it (grouped kv heads, biases, scale, soft-capping, sinks)."""
    return {
        "n_kv_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "bias": c.qkv_bias,
        "out_bias": c.o_bias,
        "scale": c.head_dim**-0.5 if c.scale is None else c.scale,
        "softcap": c.softcap,
        "sinks": c.sinks,
    }


class LlamaDecoder(DecoderModel):
    """The rotary pre-norm decoder. Later families override the ``make_*`` factories
    (each called once per layer while building) and keep the forward pass."""

    rotate_in_float32 = False  # OLMo 2 rotates q and k in float32 (see ``rope.rotary``)

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.num_hidden_layers
        self.num_heads = c.num_attention_heads
        self.num_kv_heads = c.num_key_value_heads
        self.causal = True
        self.attention_sinks = c.sinks
        # Dynamic RoPE exists to run past max_position_embeddings: no hard limit then.
        self.max_positions = None if c.rope.rope_type == "dynamic" else c.max_position_embeddings
        self.windows = c.windows
        self.tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.blocks = nn.ModuleList(self.make_block(layer) for layer in range(c.num_hidden_layers))
        self.final_norm = self.make_norm(c.hidden_size)

    def make_norm(self, dim: int) -> nn.Module:
        return RMSNorm(dim, self.config.rms_norm_eps)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        return MultiHeadAttention(c.hidden_size, c.num_attention_heads, **attention_options(c))

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias)

    def make_block(self, layer: int) -> nn.Module:
        return PreNormBlock(
            attn=self.make_attention(layer),
            attn_norm=self.make_norm(self.config.hidden_size),
            mlp=self.make_mlp(layer),
            mlp_norm=self.make_norm(self.config.hidden_size),
        )

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.tokens(input_ids)  # (B, S, E); positions enter through RoPE

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        # One cos/sin table per distinct rotary setting (Gemma 3: local and global).
        length = input_ids.size(1)
        tables = {rope: rotary(rope, length, x, self.rotate_in_float32) for rope in set(self.config.ropes)}
        return [tables[rope] for rope in self.config.ropes]


def build(config: dict[str, Any]) -> LlamaDecoder:
    return LlamaDecoder(LlamaConfig.from_dict(config))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"norm\.weight", r"final_norm.weight"),
    # lm_head (tied or not) is dropped: we stop at the final norm.
)
