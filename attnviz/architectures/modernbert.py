"""ModernBERT: a pre-norm encoder with rotary positions and alternating local/global attention.

    embeddings   tokens, then a LayerNorm; no position table (positions enter through RoPE)
    blocks       pre-norm: x = x + Attn(Norm(x)); x = x + MLP(Norm(x)); layer 0 has no
                 attention norm (the embeddings were just normed)
    attention    one fused W_qkv (split here into W^Q, W^K, W^V); RoPE on q and k with
                 θ per layer type: ``rope_parameters.full_attention.rope_theta`` (global,
                 160 000 by default) and ``sliding_attention`` (local, 10 000)
    local/global ``layer_types``: every ``global_attn_every_n_layers``-th layer (0, 3, 6, ...)
                 attends to everything; the others only to tokens within
                 ``local_attention // 2`` positions either side, |i - j| <= window
    MLP          GeGLU: W_o · (act(x·W_i[:I]) ⊙ x·W_i[I:]), one fused W_i
    norms        LayerNorm, with biases only when ``norm_bias``; ``attention_bias`` and
                 ``mlp_bias`` switch the projections' biases
    final norm   after the last layer

torch only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import MultiHeadAttention, QKTransform, padding_mask
from .base import AttnModel, ForwardOutput, activation, config_value, layer_loop
from .decoder import PreNormBlock
from .fields import given, number, sequence, whole
from .rope import RopeConfig, rotary

MODEL_TYPES = ("modernbert",)
PREFIXES = ("model.",)

GLOBAL, LOCAL = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class ModernBertConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    layer_types: tuple[str, ...]
    window: int  # a local layer's token i sees j with |i - j| <= window
    global_theta: float
    local_theta: float
    hidden_activation: str = "gelu"
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"{len(self.layer_types)} layer_types for {self.num_hidden_layers} layers")
        unknown = sorted(set(self.layer_types) - {GLOBAL, LOCAL})
        if unknown:
            raise UnsupportedArchitectureError(
                f"ModernBERT layer_types {unknown} are not implemented by the own engine"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModernBertConfig:
        layers = int(config["num_hidden_layers"])
        every = whole(config, "global_attn_every_n_layers", 3)
        types = sequence(config, "layer_types", [LOCAL if i % every else GLOBAL for i in range(layers)])
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=int(config["num_attention_heads"]),
            max_position_embeddings=int(config_value(config, "max_position_embeddings", default=8192)),
            layer_types=tuple(types),
            window=whole(config, "local_attention", 128, low=2) // 2,
            global_theta=_theta(config, GLOBAL, "global_rope_theta", 160_000.0),
            local_theta=_theta(config, LOCAL, "local_rope_theta", 10_000.0),
            hidden_activation=str(config_value(config, "hidden_activation", default="gelu")),
            norm_eps=float(config_value(config, "norm_eps", default=1e-5)),
            norm_bias=bool(config.get("norm_bias", False)),
            attention_bias=bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
        )


def _theta(config: dict[str, Any], layer_type: str, old_key: str, default: float) -> float:
    """RoPE θ of one layer type: transformers 5 writes ``rope_parameters: {layer_type:
    {rope_type, rope_theta}}``; older configs ``global_rope_theta`` / ``local_rope_theta``."""
    params: dict[str, Any] = given(given(config, "rope_parameters", {}), layer_type, {})
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise UnsupportedArchitectureError(
            f"rope_parameters.{layer_type}.rope_type={rope_type!r} is not implemented by the own engine "
            "(only plain RoPE)"
        )
    return number(params, "rope_theta", given(config, old_key, default), above=0.0)


def _norm(c: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(c.hidden_size, eps=c.norm_eps, bias=c.norm_bias)


class GeGLU(nn.Module):
    def __init__(self, c: ModernBertConfig) -> None:
        super().__init__()
        self.wi = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=c.mlp_bias)
        self.wo = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.act = activation(c.hidden_activation)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.wi(x).chunk(2, dim=-1)  # (B, S, I) each
        return self.wo(self.act(value) * gate)


class ModernBert(AttnModel):
    def __init__(self, c: ModernBertConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.num_hidden_layers
        self.num_heads = self.num_kv_heads = c.num_attention_heads
        self.causal = False
        self.max_positions = c.max_position_embeddings
        self.tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_norm = _norm(c)
        self.blocks = nn.ModuleList(
            PreNormBlock(
                attn=MultiHeadAttention(
                    c.hidden_size, c.num_attention_heads, bias=c.attention_bias, scale=c.head_dim**-0.5
                ),
                # Layer 0 reads the freshly normed embeddings: no second norm.
                attn_norm=nn.Identity() if i == 0 else _norm(c),
                mlp=GeGLU(c),
                mlp_norm=_norm(c),
            )
            for i in range(c.num_hidden_layers)
        )
        self.final_norm = _norm(c)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_layer: int | None = None,
        *,
        layers: Collection[int] | None = None,
        queries: Sequence[int] | None = None,
        fused: bool = True,
    ) -> ForwardOutput:
        """input_ids (B, S), attention_mask (B, S) of 1/0; ``layers``, ``queries`` and
        ``fused`` as ``AttnModel.forward`` says. ``hidden_states`` is after the final norm
        when every layer ran, else the raw output of layer ``max_layer``."""
        c = self.config
        length = input_ids.size(1)
        # 1. Token embeddings, normed.
        x = self.embed_norm(self.tokens(input_ids))  # (B, S, E)
        # 2. One rotary transform and one mask per layer type.
        rope: dict[str, QKTransform] = {
            GLOBAL: rotary(RopeConfig("default", c.global_theta, c.head_dim, c.max_position_embeddings), length, x),
            LOCAL: rotary(RopeConfig("default", c.local_theta, c.head_dim, c.max_position_embeddings), length, x),
        }
        positions = torch.arange(length, device=input_ids.device)
        near = (positions[:, None] - positions[None, :]).abs() <= c.window  # (L, S)
        everything = torch.ones(1, 1, 1, length, dtype=torch.bool, device=input_ids.device)  # (1, 1, 1, S)
        pad = everything if attention_mask is None else padding_mask(attention_mask)  # (B, 1, 1, S)
        masks = {GLOBAL: pad, LOCAL: pad & near[None, None]}  # (B, 1, 1, S), (B, 1, L, S)
        # 3. The layers.
        last = self.num_layers - 1 if max_layer is None else max_layer
        requests = self.row_requests(last, layers, queries, fused)
        kinds = c.layer_types
        x, attentions = layer_loop(
            x, last + 1, lambda n, x: self.blocks[n](x, masks[kinds[n]], rope[kinds[n]], requests[n])
        )
        if last == self.num_layers - 1:
            x = self.final_norm(x)
        return ForwardOutput(hidden_states=x, attentions=attentions)


def build(config: dict[str, Any]) -> ModernBert:
    return ModernBert(ModernBertConfig.from_dict(config))


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split each fused W_qkv (3·E × E, rows [W^Q; W^K; W^V]) into our three projections."""
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if ".attn.qkv." in name:
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                out[name.replace(".attn.qkv.", f".attn.{part}_proj.")] = chunk
        else:
            out[name] = tensor
    return out


RULES = (
    (r"embeddings\.tok_embeddings\.weight", r"tokens.weight"),
    (r"embeddings\.norm\.(weight|bias)", r"embed_norm.\1"),
    (r"layers\.(\d+)\.attn_norm\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"layers\.(\d+)\.attn\.Wqkv\.(weight|bias)", r"blocks.\1.attn.qkv.\2"),
    (r"layers\.(\d+)\.attn\.Wo\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"layers\.(\d+)\.mlp_norm\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"layers\.(\d+)\.mlp\.Wi\.(weight|bias)", r"blocks.\1.mlp.wi.\2"),
    (r"layers\.(\d+)\.mlp\.Wo\.(weight|bias)", r"blocks.\1.mlp.wo.\2"),
    (r"final_norm\.(weight|bias)", r"final_norm.\1"),
    # The MLM head (head.*, decoder.*) is dropped: we stop at the final norm.
)
