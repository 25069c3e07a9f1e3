"""Granite-4.0-H (``granitemoehybrid``): Bamba's hybrid of Mamba2 and softmax attention
layers (bamba.py, mamba2.py) with Granite's multipliers (granite.py) and a mixture of
experts beside a shared MLP.

    layers      ``layer_types``: "mamba" / "linear_attention" a Mamba2 layer,
                "attention" / "full_attention" a softmax one (all Mamba2 if absent)
    embed       x = E[ids] · ``embedding_multiplier``
    scores      softmax(q·kᵀ · ``attention_multiplier``), in place of 1/√D
    positions   RoPE on every dim with ``position_embedding_type`` "rope"; none
                otherwise (the released models: "nope")
    residual    x = x + m_res · Mixer(Norm_1(x)),  x = x + m_res · MLP(Norm_2(x))
    MLP(h)      = Experts(h) + Shared(h)          Shared: W_out·(SiLU(h·W_g) ⊙ h·W_u), from
                                                  the fused ``input_linear``; Experts: the
                                                  top ``num_experts_per_tok`` of
                                                  ``num_local_experts`` by router logit,
                                                  weighted by the softmax over those k
                                                  logits (none with 0 experts)

``logits_scaling`` divides the LM head's logits (measures/lm.py). torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import QKTransform
from .bamba import BambaConfig, BambaDecoder, mamba_fields
from .fields import given, number, sequence, whole
from .granite import ScaledResidualBlock
from .hybrid import MixerBlock
from .llama import LlamaConfig, SwiGLU
from .moe import SparseMoE
from .moe import convert as moe_convert
from .rope import rope_config

MODEL_TYPES = ("granitemoehybrid",)
PREFIXES = ("model.",)

_MAMBA = ("mamba", "linear_attention")
_ATTENTION = ("attention", "full_attention")


@dataclass(frozen=True)
class GraniteHybridConfig(BambaConfig):
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    num_experts: int = 0
    num_experts_per_tok: int = 1
    shared_intermediate_size: int = 1
    rotary: bool = False  # position_embedding_type "rope"


class LogitTopKMoE(SparseMoE):
    """GraniteMoE's routing: the k largest router logits, softmaxed among themselves."""

    def route(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.router(flat).float()  # (T, X)
        top, chosen = torch.topk(logits, self.top_k, dim=-1)  # (T, k), (T, k)
        return torch.softmax(top, dim=-1), chosen


class ExpertsAndShared(nn.Module):
    """Experts(h) + Shared(h), in transformers' order of the sum; the shared MLP alone
    without experts."""

    def __init__(self, routed: SparseMoE | None, shared: SwiGLU) -> None:
        super().__init__()
        self.routed, self.shared = routed, shared

    def forward(self, h: Tensor) -> Tensor:
        if self.routed is None:
            return self.shared(h)
        return self.routed(h) + self.shared(h)


class GraniteHybridDecoder(BambaDecoder):
    config: GraniteHybridConfig

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        shared = SwiGLU(c.hidden_size, c.shared_intermediate_size, c.hidden_act)
        routed = None
        if c.num_experts > 0:
            routed = LogitTopKMoE(
                c.hidden_size, c.intermediate_size, c.num_experts, c.num_experts_per_tok, c.hidden_act, False
            )
        return ExpertsAndShared(routed, shared)

    def make_block(self, layer: int) -> nn.Module:
        c = self.config
        e, m = c.hidden_size, c.residual_multiplier
        if layer in c.attention_indices:
            return ScaledResidualBlock(
                self.make_attention(layer), self.make_norm(e), self.make_mlp(layer), self.make_norm(e), m
            )
        return MixerBlock(self.make_mixer(), self.make_norm(e), self.make_mlp(layer), self.make_norm(e), m)

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.tokens(input_ids) * self.config.embedding_multiplier  # (B, S, E)

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> list[QKTransform | None]:
        if self.config.rotary:
            return list(super().qk_transforms(input_ids, x))
        return [None] * self.num_layers  # NoPE: positions enter through the Mamba2 layers alone


def build(config: dict[str, Any]) -> GraniteHybridDecoder:
    # Absent keys read as transformers' GraniteMoeHybridConfig defaults them.
    layers = whole(config, "num_hidden_layers", 32)
    hidden = whole(config, "hidden_size", 4096)
    heads = whole(config, "num_attention_heads", 32)
    head_dim = whole(config, "head_dim", hidden // heads)
    types = sequence(config, "layer_types", ["linear_attention"] * layers)
    if len(types) != layers:
        raise ValueError(f"layer_types names {len(types)} layers, not {layers}")
    unknown = sorted({str(t) for t in types} - {*_MAMBA, *_ATTENTION})
    if unknown:
        raise ValueError(f"layer_types {unknown} are neither mamba nor attention")
    rope = config.get("position_embedding_type") == "rope"
    base = LlamaConfig.from_dict(
        {**config, "num_key_value_heads": given(config, "num_key_value_heads", heads)},
        num_hidden_layers=layers,
        hidden_size=hidden,
        head_dim=head_dim,
        rms_norm_eps=number(config, "rms_norm_eps", 1e-6, above=0.0),
        max_position_embeddings=whole(config, "max_position_embeddings", 2048),
        scale=number(config, "attention_multiplier", 1.0),  # in place of 1/√D
        ropes=(rope_config(config, head_dim),) * layers,
        windows=(None,) * layers,
        mlp_bias=False,
    )
    return GraniteHybridDecoder(
        GraniteHybridConfig(
            **vars(base),
            attention_indices=tuple(i for i, kind in enumerate(types) if kind in _ATTENTION),
            **mamba_fields(config, hidden),
            embedding_multiplier=number(config, "embedding_multiplier", 1.0),
            residual_multiplier=number(config, "residual_multiplier", 1.0),
            num_experts=whole(config, "num_local_experts", 8, low=0),
            num_experts_per_tok=whole(config, "num_experts_per_tok", 2),
            shared_intermediate_size=whole(config, "shared_intermediate_size", 1024),
            rotary=rope,
        )
    )


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.mamba\.([\w.]+)", r"blocks.\1.mixer.\2"),
    # The experts as the released checkpoints store them (and transformers saves them):
    # input_linear (X, 2I, E), gate rows first, output_linear (X, E, I), router.layer; or
    # under transformers' in-memory names.
    (r"layers\.(\d+)\.block_sparse_moe\.router\.(?:layer\.)?weight", r"blocks.\1.mlp.routed.router.weight"),
    (r"layers\.(\d+)\.block_sparse_moe\.input_linear\.weight", r"blocks.\1.mlp.routed.experts.gate_up_proj"),
    (r"layers\.(\d+)\.block_sparse_moe\.output_linear\.weight", r"blocks.\1.mlp.routed.experts.down_proj"),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.routed.experts.\2"),
    (r"layers\.(\d+)\.shared_mlp\.input_linear\.weight", r"blocks.\1.mlp.shared.input_linear.weight"),
    (r"layers\.(\d+)\.shared_mlp\.output_linear\.weight", r"blocks.\1.mlp.shared.down.weight"),
    (r"norm\.weight", r"final_norm.weight"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """The fused experts split (moe.py); the shared MLP's fused ``input_linear`` (2I, E),
    gate rows first, into our gate and up."""
    out: dict[str, Tensor] = {}
    for name, tensor in moe_convert(tensors, config).items():
        if name.endswith(".shared.input_linear.weight"):
            gate, up = tensor.chunk(2, dim=0)  # transformers: act(chunk 0) * chunk 1
            prefix = name.removesuffix("input_linear.weight")
            out[f"{prefix}gate.weight"], out[f"{prefix}up.weight"] = gate, up
        else:
            out[name] = tensor
    return out
