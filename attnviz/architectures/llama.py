"""The Llama family (Llama, Mistral, Qwen2): a causal pre-RMSNorm decoder with
rotary position embeddings, grouped-query attention and a SwiGLU MLP.

    RMSNorm(x)  = x / √(mean(x²) + eps) · w           (computed in float32)
    RoPE        rotates each (i, i + D/2) pair of q and k by position · θ^(-2i/D)
    GQA         H query heads share G key/value heads, H/G query heads per group
    MLP(x)      = W_down · (SiLU(W_gate · x) ⊙ W_up · x)

Where the members differ:
    llama    attention_bias (q/k/v/o), mlp_bias, head_dim may differ from E/H
    mistral  no biases; sliding-window attention (each token sees its last
             ``sliding_window`` tokens) when ``sliding_window`` is set
    qwen2    q/k/v biases, no o bias; sliding window only with
             ``use_sliding_window``, on the layers ``layer_types`` names

Rotary cos/sin are computed in the forward pass, not kept as buffers: models are
built on the meta device and filled from the checkpoint, which holds no cos/sin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention, QKTransform
from ..errors import UnsupportedArchitectureError
from .base import activation, config_value
from .decoder import DecoderModel, PreNormBlock

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
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    windows: tuple[int | None, ...] = ()  # per layer: sliding window, or None

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

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> LlamaConfig:
        model_type = config.get("model_type", "llama")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        if model_type == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        elif model_type == "mistral":
            qkv_bias = o_bias = mlp_bias = False
        else:
            qkv_bias = o_bias = bool(config.get("attention_bias", False))
            mlp_bias = bool(config.get("mlp_bias", False))
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(config_value(config, "num_key_value_heads", default=heads)),
            head_dim=int(config_value(config, "head_dim", default=hidden // heads)),
            max_position_embeddings=int(config_value(config, "max_position_embeddings", default=2048)),
            rms_norm_eps=float(config_value(config, "rms_norm_eps", default=1e-6)),
            hidden_act=str(config_value(config, "hidden_act", default="silu")),
            rope_theta=_rope_theta(config),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=mlp_bias,
            windows=_windows(config, model_type, layers),
        )


def _rope_theta(config: dict[str, Any]) -> float:
    """θ of plain RoPE. transformers 5 writes ``rope_parameters: {rope_type, rope_theta}``;
    older configs have top-level ``rope_theta`` and ``rope_scaling``."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise UnsupportedArchitectureError("per-layer rope_parameters are not implemented by the own engine")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        # llama3 / yarn / linear / dynamic rescale the frequencies: other math.
        raise UnsupportedArchitectureError(
            f"rope_type {rope_type!r} is not implemented by the own engine (only plain RoPE)"
        )
    return float(params.get("rope_theta") or config.get("rope_theta") or 10000.0)


def _windows(config: dict[str, Any], model_type: str, layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window, as transformers' Mistral and Qwen2 choose it."""
    window = config.get("sliding_window")
    if model_type == "mistral":
        return (window,) * layers  # None in the config means full causal attention
    if model_type == "qwen2":
        if not config.get("use_sliding_window") or window is None:
            return (None,) * layers
        first = int(config.get("max_window_layers", 28))
        types = config.get("layer_types") or [
            "sliding_attention" if i >= first else "full_attention" for i in range(layers)
        ]
        return tuple(window if kind == "sliding_attention" else None for kind in types)
    if config.get("layer_types") and any(kind != "full_attention" for kind in config["layer_types"]):
        raise UnsupportedArchitectureError(
            f"layer_types other than full_attention are not implemented for {model_type!r}"
        )
    return (None,) * layers


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # In float32 whatever the model's dtype, as transformers does: mean(x²) of
        # half-precision activations overflows and loses digits.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.act = activation(c.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary(length: int, head_dim: int, theta: float, like: Tensor) -> QKTransform:
    """The RoPE transform for positions 0..length-1, in ``like``'s dtype and device."""
    # 1. Inverse frequencies θ^(-2i/D), on the CPU in float32 as transformers computes them.
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))  # (D/2,)
    # 2. Angle of every (position, frequency); both halves of a head share the angles.
    positions = torch.arange(length, device=like.device).float()  # (S,)
    freqs = positions[:, None] * inv_freq.to(like.device)  # (S, D/2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (S, D)
    cos, sin = angles.cos().to(like.dtype), angles.sin().to(like.dtype)  # (S, D)

    def apply(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        # 3. Rotate: q·cos + rotate_half(q)·sin, broadcast over (B, H) / (B, G).
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin  # (B, H, L, D), (B, G, S, D)

    return apply


class LlamaDecoder(DecoderModel):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.num_hidden_layers
        self.num_heads = c.num_attention_heads
        self.num_kv_heads = c.num_key_value_heads
        self.causal = True
        self.max_positions = c.max_position_embeddings
        self.windows = c.windows
        self.tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.blocks = nn.ModuleList(
            PreNormBlock(
                attn=MultiHeadAttention(
                    c.hidden_size,
                    c.num_attention_heads,
                    n_kv_heads=c.num_key_value_heads,
                    head_dim=c.head_dim,
                    bias=c.qkv_bias,
                    out_bias=c.o_bias,
                    scale=c.head_dim**-0.5,
                ),
                attn_norm=RMSNorm(c.hidden_size, c.rms_norm_eps),
                mlp=SwiGLU(c),
                mlp_norm=RMSNorm(c.hidden_size, c.rms_norm_eps),
            )
            for _ in range(c.num_hidden_layers)
        )
        self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.tokens(input_ids)  # (B, S, E); positions enter through RoPE

    def qk_transform(self, input_ids: Tensor, x: Tensor) -> QKTransform | None:
        return rotary(input_ids.size(1), self.config.head_dim, self.config.rope_theta, x)


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
