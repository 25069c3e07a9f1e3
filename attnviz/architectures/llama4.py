"""Llama 4's text stack (``llama4_text``: Scout, Maverick): the Llama decoder with three
kinds of layer and a mixture of experts with a shared expert.

    RoPE layers       (``no_rope_layers[i]`` = 1; three of every four by default)
                      RoPE on consecutive pairs (2i, 2i+1), as a complex product; then q
                      and k each RMS-normed over D without a weight (``use_qk_norm``: the
                      "L2 norm" of the Llama 4 code); and, with ``attention_chunk_size``,
                      chunked attention: token i sees tokens j ≤ i of its own chunk of
                      that many positions, j // chunk = i // chunk (``layer_types``
                      "chunked_attention")
    NoPE layers       no position transform and no q/k norm, every token before; with
                      ``attn_temperature_tuning`` the queries are scaled by position,
                      q_i · (1 + attn_scale · ln(1 + ⌊(i + 1) / floor_scale⌋)), which is 1
                      for the first ``floor_scale`` - 1 positions
    scale             D^(-1/2)
    MoE layers        (``moe_layers``) out = SwiGLU_shared(x) + Σ_e SwiGLU_e(x · s_e), with
                      s = σ(router logits) on the top ``num_experts_per_tok`` experts and 0
                      on the others: the score scales each expert's input, not its output;
                      dense layers a SwiGLU ``intermediate_size_mlp`` wide

All of it is in the q/k transform, the mask and the MLP: the attention is plain
``MultiHeadAttention``, so every measure, the row strategies and the taps apply unchanged.
The experts are kept as transformers keeps them, (X, E, 2I) and (X, I, E), and run as it
runs them (one batched product over every expert and every token), so they round alike.
torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import QKTransform
from .base import activation
from .fields import given, number, sequence, whole
from .llama import LlamaConfig, LlamaDecoder, SwiGLU

MODEL_TYPES = ("llama4_text",)
PREFIXES = ("model.", "language_model.model.")


@dataclass(frozen=True)
class Llama4Config(LlamaConfig):
    rope_layers: tuple[bool, ...] = ()  # per layer: RoPE (and the q/k norm), or NoPE
    chunks: tuple[int | None, ...] = ()  # per layer: the attention chunk, or None
    use_qk_norm: bool = True
    attn_temperature_tuning: bool = True
    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    moe_layers: tuple[int, ...] = ()
    num_local_experts: int = 1
    num_experts_per_tok: int = 1
    intermediate_size_mlp: int = 1  # the dense layers' width (``intermediate_size``: the experts')

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.num_hidden_layers
        if len(self.rope_layers) != n or len(self.chunks) != n:
            raise ValueError(f"no_rope_layers and layer_types must name each of the {n} layers")
        if not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be between 1 and {self.num_local_experts}"
            )


class Llama4MoE(nn.Module):
    """The shared expert plus every routed expert on its score-scaled input (module docstring)."""

    def __init__(self, hidden: int, inner: int, num_experts: int, top_k: int, act: str) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden, 2 * inner))  # (X, E, 2I)
        self.down_proj = nn.Parameter(torch.empty(num_experts, inner, hidden))  # (X, I, E)
        self.shared = SwiGLU(hidden, inner, act)
        self.act, self.top_k, self.num_experts = activation(act), top_k, num_experts

    def forward(self, x: Tensor) -> Tensor:
        b, s, e = x.shape
        flat = x.reshape(-1, e)  # (T, E)
        # 1. Scores: σ of the top-k router logits, 0 for the other experts.
        logits = self.router(flat)  # (T, X)
        top, chosen = torch.topk(logits, self.top_k, dim=1)  # (T, k)
        scores = torch.full_like(logits, float("-inf")).scatter_(1, chosen, top)
        scores = torch.sigmoid(scores.float()).to(scores.dtype)  # (T, X)
        # 2. Every expert on every token, its input scaled by its score (0: no effect, as
        #    SwiGLU(0) = 0), in one batched product per matrix.
        routed_in = flat.repeat(self.num_experts, 1) * scores.transpose(0, 1).reshape(-1, 1)  # (X·T, E)
        gate, up = torch.bmm(routed_in.view(self.num_experts, -1, e), self.gate_up_proj).chunk(2, dim=-1)
        routed = torch.bmm(up * self.act(gate), self.down_proj)  # (X, T, E)
        # 3. The shared expert, and the experts' sum added to it.
        out = self.shared(flat)  # (T, E)
        out.add_(routed.sum(dim=0))
        return out.reshape(b, s, e)


def weightless_rms_norm(x: Tensor, eps: float) -> Tensor:
    """x / √(mean(x²) + eps) over the last dim, in float32 (Llama 4's q/k "L2 norm")."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


class Llama4Decoder(LlamaDecoder):
    config: Llama4Config

    def __init__(self, c: Llama4Config) -> None:
        super().__init__(c)
        self.chunks = c.chunks

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        if layer in c.moe_layers:
            return Llama4MoE(
                c.hidden_size, c.intermediate_size, c.num_local_experts, c.num_experts_per_tok, c.hidden_act
            )
        return SwiGLU(c.hidden_size, c.intermediate_size_mlp, c.hidden_act)

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        c = self.config
        length = input_ids.size(1)
        # RoPE on consecutive pairs: each pair a complex number times e^(iθ)·attention_factor.
        inv_freq, scaling = c.rope.frequencies(length)
        angles = torch.arange(length, device=x.device).float()[:, None] * inv_freq.to(x.device)  # (S, D/2)
        turns = torch.polar(torch.ones_like(angles), angles) * scaling  # (S, D/2) complex

        def rope_and_norm(x: Tensor) -> Tensor:
            # In transformers' (B, S, heads, D) layout: complex products and the norm's sums
            # round by the memory layout they run on (measured: 2.4e-7 apart otherwise).
            t = x.transpose(1, 2)  # (B, S, heads, D)
            pairs = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))  # (B, S, heads, D/2)
            t = torch.view_as_real(pairs * turns[:, None, :]).flatten(3).type_as(x)  # (B, S, heads, D)
            if c.use_qk_norm:
                t = weightless_rms_norm(t, c.rms_norm_eps)
            return t.transpose(1, 2).contiguous()  # (B, heads, S, D)

        def rope_layer(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            return rope_and_norm(q), rope_and_norm(k)  # (B, H, L, D), (B, G, S, D)

        # Attention temperature of the NoPE layers: 1 + attn_scale · ln(1 + ⌊(i + 1) / floor_scale⌋).
        positions = torch.arange(length, device=x.device).float()
        temperature = torch.log1p(torch.floor((positions + 1.0) / c.floor_scale)) * c.attn_scale + 1.0  # (L,)

        def nope_layer(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            return (q * temperature[:, None]).to(q.dtype), k  # (B, H, L, D)

        plain = None if not c.attn_temperature_tuning else nope_layer
        return [rope_layer if uses else plain for uses in c.rope_layers]


def build(config: dict[str, Any]) -> Llama4Decoder:
    # Absent keys read as transformers' Llama4TextConfig defaults them.
    layers = whole(config, "num_hidden_layers", 48)
    interval = whole(config, "no_rope_layer_interval", 4)
    given_rope = sequence(config, "no_rope_layers", [])
    # transformers: an empty list means the default (a NoPE layer every ``interval``).
    rope_flags = [int(v) for v in given_rope] or [int((i + 1) % interval != 0) for i in range(layers)]
    chunk = config.get("attention_chunk_size", 8192)
    chunk = None if chunk is None else whole(config, "attention_chunk_size", 8192)
    types = sequence(
        config,
        "layer_types",
        ["chunked_attention" if rope and chunk is not None else "full_attention" for rope in rope_flags],
    )
    unknown = sorted(set(types) - {"chunked_attention", "full_attention"})
    if unknown or len(types) != layers:
        raise ValueError(f"layer_types {list(types)} must name full or chunked attention for each of {layers} layers")
    if "chunked_attention" in types and chunk is None:
        raise ValueError("chunked_attention layers need an attention_chunk_size")
    step = whole(config, "interleave_moe_layer_step", 1)
    moe = sequence(config, "moe_layers", list(range(step - 1, layers, step)))
    base = LlamaConfig.from_dict(
        config,
        head_dim=whole(config, "head_dim", int(config["hidden_size"]) // int(config["num_attention_heads"])),
        qkv_bias=bool(given(config, "attention_bias", False)),
        o_bias=bool(given(config, "attention_bias", False)),
        mlp_bias=False,
        rms_norm_eps=number(config, "rms_norm_eps", 1e-5, above=0.0),
        windows=(None,) * layers,
    )
    return Llama4Decoder(
        Llama4Config(
            **vars(base),
            rope_layers=tuple(bool(flag) for flag in rope_flags),
            chunks=tuple(chunk if kind == "chunked_attention" else None for kind in types),
            use_qk_norm=bool(given(config, "use_qk_norm", True)),
            attn_temperature_tuning=bool(given(config, "attn_temperature_tuning", True)),
            floor_scale=number(config, "floor_scale", 8192, above=0.0),
            attn_scale=number(config, "attn_scale", 0.1),
            moe_layers=tuple(int(i) for i in moe),
            num_local_experts=whole(config, "num_local_experts", 16),
            num_experts_per_tok=whole(config, "num_experts_per_tok", 1),
            intermediate_size_mlp=whole(config, "intermediate_size_mlp", 16384),
        )
    )


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.feed_forward\.router\.weight", r"blocks.\1.mlp.router.weight"),
    (r"layers\.(\d+)\.feed_forward\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.\2"),
    (r"layers\.(\d+)\.feed_forward\.shared_expert\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.shared.\2.weight"),
    (r"layers\.(\d+)\.feed_forward\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
    (r"norm\.weight", r"final_norm.weight"),
)
