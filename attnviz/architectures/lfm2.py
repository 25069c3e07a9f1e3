"""LFM2 (Liquid AI): a hybrid of gated short convolutions and softmax attention layers
(``layer_types`` "conv" / "full_attention"; or ``full_attn_idxs``), over SwiGLU MLPs.

Softmax attention layers: Llama's grouped-query attention with an RMSNorm on each head's
queries and keys (``q_layernorm``, ``k_layernorm``: Llama's w, over D, before RoPE), no
biases, W^O called ``out_proj``; D = E/H.

Short-convolution layers (``Lfm2ShortConv``) have no attention weights; they are computed
exactly so that the hidden states reaching the next softmax layer are transformers':

    B, C, x̃  = x·W^in                       one projection (E -> 3E), split in three
    y        = causal depthwise conv(B ⊙ x̃)  ``conv_L_cache`` taps per channel: position t
                                              sees t-L+1..t; no activation
    out      = W^out · (C ⊙ y)

(``conv_bias``: biases on W^in, the convolution and W^out.) Padding tokens are zeroed at
the layer's input, as transformers does, so they write nothing into later positions.

The layers: x = x + Mixer(Norm(x)); x = x + FFN(Norm(x)) (``operator_norm``, ``ffn_norm``);
the stack's final RMSNorm is called ``embedding_norm``. The embeddings are tied to the LM
head. The MLP (``w1``, ``w3``, ``w2`` = gate, up, down) is ``intermediate_size`` wide
(``block_ff_dim`` in older configs), or with ``block_auto_adjust_ff_dim``
int(2·I/3), then times ``block_ffn_dim_multiplier`` rounded up to ``block_multiple_of``.

LFM2-MoE (``lfm2_moe``): the same hybrid; the first ``num_dense_layers`` layers have a
dense SwiGLU of ``intermediate_size`` (never adjusted), the others routed experts:

    s        = σ(x · W_routerᵀ)                 X experts, no groups, no shared expert
    top      the k best of s + b (b: ``expert_bias``, with ``use_expert_bias``: chooses,
             never weighs); weights s, divided by their sum + 1e-6 with ``norm_topk_prob``,
             times ``routed_scaling_factor``

torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from ..nn.taps import tap
from .base import config_value
from .fields import given, number, sequence, whole
from .grouped_moe import GroupedMoE
from .hybrid import HybridDecoder
from .llama import LlamaConfig, SwiGLU
from .moe import convert as moe_convert
from .qwen3 import qk_norm_attention
from .rope import rope_config

MODEL_TYPES = ("lfm2", "lfm2_moe")
PREFIXES = ("model.",)


@dataclass(frozen=True)
class Lfm2Config(LlamaConfig):
    layer_types: tuple[str, ...] = ()  # per layer: "conv", or softmax attention
    conv_kernel: int = 3  # conv_L_cache
    conv_bias: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    sparse_layers: tuple[int, ...] = ()  # the layers whose MLP is the experts (LFM2-MoE)
    use_expert_bias: bool = True
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types names {len(self.layer_types)} layers, not {self.num_hidden_layers}")
        if all(kind == "conv" for kind in self.layer_types):
            raise ValueError("no attention layer: nothing has attention weights to show")
        if self.conv_kernel < 1:
            raise ValueError(f"conv_L_cache={self.conv_kernel} must be at least 1")


class ShortConv(nn.Module):
    """LFM2's gated short convolution (module docstring); no attention weights."""

    def __init__(self, hidden: int, kernel: int, bias: bool) -> None:
        super().__init__()
        self.in_proj = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.conv = nn.Conv1d(hidden, hidden, kernel, groups=hidden, bias=bias)  # (E, 1, L): one kernel a channel
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: Tensor, padding: Tensor | None = None) -> Tensor:
        """x (B, T, E), padding (B, T) boolean (True = real token) -> (B, T, E)."""
        if padding is not None:
            x = x * padding[:, :, None].to(x.dtype)  # padding tokens write nothing into later ones
        t = x.size(1)
        # 1. The three gates side by side, channels first for the convolution.
        b, c, h = self.in_proj(x).transpose(1, 2).chunk(3, dim=1)  # (B, E, T) each
        # 2. The input gate, then the causal convolution: padded by L-1 on the left alone.
        kernel = self.conv.kernel_size[0]
        y = nn.functional.conv1d(b * h, self.conv.weight, self.conv.bias, padding=kernel - 1, groups=h.size(1))
        y = y[:, :, :t]  # (B, E, T): position t sees t-L+1..t
        # 3. The output gate, then out of the mixer.
        return self.out_proj((c * y).transpose(1, 2).contiguous())  # (B, T, E)


class ConvBlock(nn.Module):
    """A pre-norm layer whose token mixer is a short convolution."""

    def __init__(self, conv: ShortConv, attn_norm: nn.Module, mlp: nn.Module, mlp_norm: nn.Module) -> None:
        super().__init__()
        self.attn_norm, self.conv = attn_norm, conv
        self.mlp_norm, self.mlp = mlp_norm, mlp

    def forward(self, x: Tensor, padding: Tensor | None) -> Tensor:
        # The mixer's output passes the layer's attn_out tap, as a softmax layer's does.
        x = x + tap("attn_out", self.conv(self.attn_norm(x), padding))
        return x + tap("mlp_out", self.mlp(self.mlp_norm(x)))


class SigmoidRouter(nn.Module):
    """LFM2-MoE's router (module docstring): flat (T, E) -> chosen (T, k), weights (T, k)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, bias: bool, normalize: bool, scaling: float) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be between 1 and the {num_experts} experts")
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))
        self.expert_bias: Tensor | None
        self.register_buffer("expert_bias", torch.zeros(num_experts) if bias else None)
        self.top_k, self.normalize, self.scaling = top_k, normalize, scaling

    def forward(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        logits = nn.functional.linear(flat, self.weight)  # (T, X)
        scores = logits.sigmoid()
        if self.expert_bias is not None:
            chosen = torch.topk(scores + self.expert_bias, k=self.top_k, dim=-1)[1]  # (T, k)
            weights = scores.gather(1, chosen).type_as(logits)
        else:
            weights, chosen = torch.topk(scores, k=self.top_k, dim=-1)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-6)
        return chosen, weights * self.scaling


class Lfm2Decoder(HybridDecoder):
    config: Lfm2Config
    mixer = "short-convolution"

    def softmax_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.config.layer_types) if kind != "conv")

    def make_attention(self, layer: int) -> MultiHeadAttention:
        return qk_norm_attention(self.config)

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        if layer not in c.sparse_layers:
            return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act)
        router = SigmoidRouter(
            c.hidden_size,
            c.num_experts,
            c.num_experts_per_tok,
            c.use_expert_bias,
            c.norm_topk_prob,
            c.routed_scaling_factor,
        )
        return GroupedMoE(router, c.num_experts, c.hidden_size, c.moe_intermediate_size, 0, c.hidden_act)

    def make_block(self, layer: int) -> nn.Module:
        c = self.config
        if c.layer_types[layer] == "conv":
            conv = ShortConv(c.hidden_size, c.conv_kernel, c.conv_bias)
            return ConvBlock(conv, self.make_norm(c.hidden_size), self.make_mlp(layer), self.make_norm(c.hidden_size))
        return super().make_block(layer)


def mlp_width(config: dict[str, Any]) -> int:
    """LFM2's SwiGLU width: ``intermediate_size`` (``block_ff_dim`` wins, as transformers
    reads it), adjusted as ``Lfm2MLP`` does with ``block_auto_adjust_ff_dim``."""
    width = whole(config, "block_ff_dim", whole(config, "intermediate_size", 12288))
    if not bool(given(config, "block_auto_adjust_ff_dim", True)):
        return width
    width = int(2 * width / 3)
    multiplier = config.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        multiple = whole(config, "block_multiple_of", 256)
        width = int(number(config, "block_ffn_dim_multiplier", 1.0) * width)
        width = multiple * ((width + multiple - 1) // multiple)
    return width


def build(config: dict[str, Any]) -> Lfm2Decoder:
    moe = given(config, "model_type", "lfm2") == "lfm2_moe"
    layers = whole(config, "num_hidden_layers", 32)
    hidden = whole(config, "hidden_size", 2048 if moe else 2560)
    heads = whole(config, "num_attention_heads", 32)
    kinds = config.get("layer_types")
    if kinds is None:  # LFM2's older configs: the attention layers by index (none: every layer)
        attention = {int(i) for i in sequence(config, "full_attn_idxs", list(range(layers)))}
        kinds = ["full_attention" if i in attention else "conv" for i in range(layers)]
    head_dim = int(config_value(config, "head_dim", default=hidden // heads))
    dense = whole(config, "num_dense_layers", 2, low=0) if moe else layers
    experts = whole(config, "num_experts", 32) if moe else 0
    width = whole(config, "intermediate_size", 7168) if moe else mlp_width(config)
    sizes = {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": width,
    }
    base = LlamaConfig.from_dict(
        {**config, **sizes},
        head_dim=head_dim,
        num_key_value_heads=whole(config, "num_key_value_heads", 8),
        max_position_embeddings=whole(config, "max_position_embeddings", 128000),
        rms_norm_eps=number(config, "norm_eps", 1e-5, above=0.0),
        hidden_act="silu",  # Lfm2MLP's F.silu, whatever the config says
        qkv_bias=False,
        o_bias=False,
        ropes=(rope_config(config, head_dim, default_theta=1000000.0),) * layers,
        windows=(None,) * layers,
    )
    return Lfm2Decoder(
        Lfm2Config(
            **vars(base),
            layer_types=tuple(str(kind) for kind in kinds),
            conv_kernel=whole(config, "conv_L_cache", 3),
            conv_bias=bool(given(config, "conv_bias", False)),
            num_experts=experts,
            num_experts_per_tok=whole(config, "num_experts_per_tok", 4) if moe else 1,
            moe_intermediate_size=whole(config, "moe_intermediate_size", 1792) if moe else 1,
            sparse_layers=tuple(range(dense, layers)) if moe else (),
            use_expert_bias=bool(given(config, "use_expert_bias", True)),
            norm_topk_prob=bool(given(config, "norm_topk_prob", True)),
            routed_scaling_factor=number(config, "routed_scaling_factor", 1.0),
        )
    )


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.operator_norm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.ffn_norm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkv])_proj\.weight", r"blocks.\1.attn.\2_proj.weight"),
    (r"layers\.(\d+)\.self_attn\.out_proj\.weight", r"blocks.\1.attn.o_proj.weight"),
    (r"layers\.(\d+)\.self_attn\.([qk])_layernorm\.weight", r"blocks.\1.attn.\2_norm.weight"),
    (r"layers\.(\d+)\.conv\.(in_proj|conv|out_proj)\.(weight|bias)", r"blocks.\1.conv.\2.\3"),
    (r"layers\.(\d+)\.feed_forward\.w1\.weight", r"blocks.\1.mlp.gate.weight"),
    (r"layers\.(\d+)\.feed_forward\.w3\.weight", r"blocks.\1.mlp.up.weight"),
    (r"layers\.(\d+)\.feed_forward\.w2\.weight", r"blocks.\1.mlp.down.weight"),
    # LFM2-MoE: the router, its bias, and the experts (fused as transformers saves them, or apart).
    (r"layers\.(\d+)\.feed_forward\.gate\.weight", r"blocks.\1.mlp.router.weight"),
    (r"layers\.(\d+)\.feed_forward\.expert_bias", r"blocks.\1.mlp.router.expert_bias"),
    (r"layers\.(\d+)\.feed_forward\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.experts.\2"),
    (r"layers\.(\d+)\.feed_forward\.experts\.(\d+)\.w1\.weight", r"blocks.\1.mlp.experts.\2.gate.weight"),
    (r"layers\.(\d+)\.feed_forward\.experts\.(\d+)\.w3\.weight", r"blocks.\1.mlp.experts.\2.up.weight"),
    (r"layers\.(\d+)\.feed_forward\.experts\.(\d+)\.w2\.weight", r"blocks.\1.mlp.experts.\2.down.weight"),
    (r"embedding_norm\.weight", r"final_norm.weight"),
)

# Fused experts (transformers' in-memory layout) split per expert, as moe.py does.
convert = moe_convert
