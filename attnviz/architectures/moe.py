"""Mixture-of-experts decoders (Mixtral, Qwen3-MoE): attention as in Llama / Qwen3; the
MLP is a router over expert SwiGLUs.

    p        = softmax(x · W_routerᵀ)                      (float32)   over the X experts
    top      = the k largest p (k = num_experts_per_tok), renormalised to sum 1 when
               the family says so (Mixtral always, Qwen3-MoE with ``norm_topk_prob``)
    MoE(x)   = Σ_{e in top} top_e · SwiGLU_e(x)

Attention does not change, but every layer's input depends on the previous layers'
MLPs, so the router and the experts are computed exactly as transformers does: the
same top-k, the experts added in ascending order, each on its tokens only.

Qwen3-MoE: layers in ``mlp_only_layers``, and all but every ``decoder_sparse_step``-th
layer, have a dense SwiGLU (``intermediate_size``) instead; experts are
``moe_intermediate_size`` wide.

Checkpoints: transformers 5 saves the experts one by one (Mixtral ``w1``/``w3``/``w2`` =
gate/up/down; Qwen3-MoE ``gate_proj``/``up_proj``/``down_proj``), as the Hub holds them;
the fused 3-D layout of its in-memory modules (``experts.gate_up_proj`` (X, 2I, E),
``experts.down_proj`` (X, E, I)) is read too and split per expert in ``convert``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from .base import config_value
from .fields import sequence, whole
from .llama import LlamaConfig, LlamaDecoder, SwiGLU
from .qwen3 import QK_NORM_RULES, qk_norm_attention

MODEL_TYPES = ("mixtral", "qwen3_moe")
PREFIXES = ("model.",)


class SparseMoE(nn.Module):
    """Top-k routing over SwiGLU experts; ``router`` is W_router (X, E)."""

    def __init__(
        self, hidden: int, inner: int, num_experts: int, top_k: int, act: str, normalize: bool, cast: bool = True
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be between 1 and the {num_experts} experts")
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(hidden, inner, act) for _ in range(num_experts))
        # cast: the routing weights go back to the model's dtype before weighting the experts
        # (Qwen3-MoE); Mixtral keeps them in float32 and casts each weighted output instead.
        self.top_k, self.normalize, self.cast = top_k, normalize, cast

    def route(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """The k most probable experts of each token (T, E): their weights (T, k) and
        indices (T, k). (DeepSeek's routers override this: mla.py.)"""
        probs = torch.softmax(self.router(flat).float(), dim=-1)  # (T, X)
        top, chosen = torch.topk(probs, self.top_k, dim=-1)  # (T, k), (T, k)
        if self.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        return top, chosen

    def forward(self, x: Tensor) -> Tensor:
        b, s, e = x.shape
        flat = x.reshape(-1, e)  # (T, E), T = B·S tokens
        # 1. Route: the k most probable experts per token, and their weights.
        top, chosen = self.route(flat)  # (T, k), (T, k)
        if self.cast:
            top = top.to(flat.dtype)
        # 2. Each expert on its tokens, weighted, added in ascending expert order.
        out = torch.zeros_like(flat)  # (T, E)
        for expert, mlp in enumerate(self.experts):
            slot, token = torch.where((chosen == expert).T)  # transformers' order: by slot, then token
            if token.numel():
                out.index_add_(0, token, (mlp(flat[token]) * top[token, slot, None]).to(out.dtype))
        return out.reshape(b, s, e)


@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    model_type: str = "mixtral"
    num_experts: int = 1
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    sparse_layers: tuple[int, ...] = ()  # layers whose MLP is the experts (the others: dense SwiGLU)
    norm_topk_prob: bool = True


class MoEDecoder(LlamaDecoder):
    config: MoEConfig

    def make_attention(self, layer: int) -> MultiHeadAttention:
        if self.config.model_type == "qwen3_moe":
            return qk_norm_attention(self.config)
        return super().make_attention(layer)

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        if layer not in c.sparse_layers:
            return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act)
        return SparseMoE(
            c.hidden_size,
            c.moe_intermediate_size,
            c.num_experts,
            c.num_experts_per_tok,
            c.hidden_act,
            c.norm_topk_prob,
            cast=c.model_type != "mixtral",
        )


def build(config: dict[str, Any]) -> MoEDecoder:
    model_type = config.get("model_type", "mixtral")
    layers = int(config["num_hidden_layers"])
    if model_type == "mixtral":
        experts = int(config["num_local_experts"])
        inner = int(config["intermediate_size"])
        sparse = tuple(range(layers))
        normalize = True
    else:
        experts = int(config_value(config, "num_experts", "num_local_experts"))
        inner = int(config["moe_intermediate_size"])
        step = whole(config, "decoder_sparse_step", 1)
        dense = set(sequence(config, "mlp_only_layers", ()))
        sparse = tuple(i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
        normalize = bool(config.get("norm_topk_prob", False))
    base = LlamaConfig.from_dict(config)
    return MoEDecoder(
        MoEConfig(
            **vars(base),
            model_type=model_type,
            num_experts=experts,
            num_experts_per_tok=int(config["num_experts_per_tok"]),
            moe_intermediate_size=inner,
            sparse_layers=sparse,
            norm_topk_prob=normalize,
        )
    )


_LLAMA_RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"norm\.weight", r"final_norm.weight"),
)

RULES = (
    *_LLAMA_RULES,
    *QK_NORM_RULES,
    # Mixtral, as saved: block_sparse_moe.gate and experts.N.w1 / w3 / w2 (gate / up / down).
    (r"layers\.(\d+)\.block_sparse_moe\.gate\.weight", r"blocks.\1.mlp.router.weight"),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w1\.weight", r"blocks.\1.mlp.experts.\2.gate.weight"),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w3\.weight", r"blocks.\1.mlp.experts.\2.up.weight"),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w2\.weight", r"blocks.\1.mlp.experts.\2.down.weight"),
    # Qwen3-MoE, as saved: mlp.gate and mlp.experts.N.{gate,up,down}_proj.
    (r"layers\.(\d+)\.mlp\.gate\.weight", r"blocks.\1.mlp.router.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.experts.\2.\3.weight"),
    # The fused layout of transformers' in-memory modules; split in convert().
    (r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.experts.\2"),
    # Dense layers (Qwen3-MoE's mlp_only_layers).
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split fused expert tensors, (X, 2I, E) gate_up and (X, E, I) down, into per-expert weights."""
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(".experts.gate_up_proj"):
            prefix = name.removesuffix("gate_up_proj")
            for expert, fused in enumerate(tensor):
                gate, up = fused.chunk(2, dim=0)  # transformers: gate, up = linear(x, gate_up).chunk(2)
                out[f"{prefix}{expert}.gate.weight"], out[f"{prefix}{expert}.up.weight"] = gate, up
        elif name.endswith(".experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for expert, down in enumerate(tensor):
                out[f"{prefix}{expert}.down.weight"] = down
        else:
            out[name] = tensor
    return out
