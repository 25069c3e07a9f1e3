"""The Gemma family (Gemma, Gemma 2, Gemma 3 text): the Llama stack with Gemma's norms,
scaled embeddings and a GELU-gated MLP, and more per generation.

    Norm(x)  = x̂ · (1 + w)       RMSNorm whose weight is stored as an offset from 1,
                                 multiplied in float32 before casting back
    embed    = E[ids] · √E       the embeddings scaled by √(hidden size), the factor
                                 rounded to the model's dtype first
    MLP(x)   = W_down · (GELU_tanh(W_gate · x) ⊙ W_up · x)

Gemma 2 adds:
    scale    query_pre_attn_scalar^(-1/2) on q·kᵀ instead of D^(-1/2)
    softcap  scores → c · tanh(scores / c) with c = attn_logit_softcapping
    layers   ``layer_types``: sliding_attention layers see the last ``sliding_window``
             tokens, full_attention layers all (alternating in Gemma 2)
    norms    a sandwich: x = x + Norm_post_attn(Attn(Norm_in(x)));
                         x = x + Norm_post_mlp(MLP(Norm_pre_mlp(x)))
Gemma 3 (text) adds:
    q/k norms  a Gemma norm on each head's q and k (over D), before RoPE
    no softcap its config may set attn_logit_softcapping, which transformers' Gemma 3
               attention ignores; so do we
    RoPE       one rope setting per layer type: local (sliding) layers θ = 10 000,
               global ones 1 000 000 (and often linear scaling)
The final logit soft-capping acts on the LM head's logits, which we never compute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import Mask, MultiHeadAttention, QKTransform
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from . import llama
from .fields import given, number, sequence, text, whole
from .llama import LlamaConfig, LlamaDecoder, SwiGLU, default_layer_types
from .qwen3 import QK_NORM_RULES, qk_norm_attention
from .rope import rope_config

MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")
PREFIXES = llama.PREFIXES


@dataclass(frozen=True)
class GemmaConfig(LlamaConfig):
    generation: int = 1  # 1, 2 or 3


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class SandwichBlock(nn.Module):
    """One Gemma 2/3 layer: a norm before and after each sub-layer, inside the residual."""

    def __init__(
        self,
        attn: MultiHeadAttention,
        attn_norm: nn.Module,
        post_attn_norm: nn.Module,
        mlp: nn.Module,
        mlp_norm: nn.Module,
        post_mlp_norm: nn.Module,
    ) -> None:
        super().__init__()
        self.attn_norm, self.attn, self.post_attn_norm = attn_norm, attn, post_attn_norm
        self.mlp_norm, self.mlp, self.post_mlp_norm = mlp_norm, mlp, post_mlp_norm

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        # 1. Self-attention between its two norms, added back to the residual stream.
        a, weights = self.attn(
            self.attn_norm(x), mask=mask, qk_transform=qk_transform, request=request
        )  # (B, L, E), (B, H, R, S)
        x = x + tap("attn_out", self.post_attn_norm(a))
        # 2. The MLP, likewise.
        x = x + tap("mlp_out", self.post_mlp_norm(self.mlp(self.mlp_norm(x))))
        return x, weights


class GemmaDecoder(LlamaDecoder):
    config: GemmaConfig

    def make_norm(self, dim: int) -> nn.Module:
        return GemmaRMSNorm(dim, self.config.rms_norm_eps)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        if self.config.generation >= 3:
            return qk_norm_attention(self.config, GemmaRMSNorm)
        return super().make_attention(layer)

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act)  # gated by GELU here, not SiLU

    def make_block(self, layer: int) -> nn.Module:
        if self.config.generation == 1:
            return super().make_block(layer)
        e = self.config.hidden_size
        return SandwichBlock(
            attn=self.make_attention(layer),
            attn_norm=self.make_norm(e),
            post_attn_norm=self.make_norm(e),
            mlp=self.make_mlp(layer),
            mlp_norm=self.make_norm(e),
            post_mlp_norm=self.make_norm(e),
        )

    def embed(self, input_ids: Tensor) -> Tensor:
        x = self.tokens(input_ids)  # (B, S, E)
        # √E as a float32 tensor cast to the weights' dtype, as transformers rounds it.
        return x * torch.tensor(self.config.hidden_size**0.5).to(x.dtype)


def gemma3_rope_parameters(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Gemma 3's rope parameters per layer type, as transformers 5 fills them in: the
    nested ``rope_parameters`` it writes, or the older layout (``rope_theta`` and
    ``rope_scaling`` for the global layers, ``rope_local_base_freq`` for the local ones)."""
    saved = config.get("rope_parameters")
    nested = {k: dict(v) for k, v in saved.items() if isinstance(v, Mapping)} if isinstance(saved, Mapping) else {}
    # An entry absent or empty ({}) is plain RoPE, as transformers' Gemma 3 config fills it in.
    plain: dict[str, Any] = {"rope_type": "default"}
    full = nested["full_attention"] if nested.get("full_attention") else dict(plain)
    if isinstance(config.get("rope_scaling"), Mapping):
        full.update(config["rope_scaling"])
    full.setdefault("rope_theta", given(config, "rope_theta", 1_000_000.0))
    sliding = nested["sliding_attention"] if nested.get("sliding_attention") else dict(plain)
    sliding.setdefault("rope_theta", given(config, "rope_local_base_freq", 10_000.0))
    return {"full_attention": full, "sliding_attention": sliding}


def build(config: dict[str, Any]) -> GemmaDecoder:
    model_type = config.get("model_type", "gemma")
    generation = {"gemma": 1, "gemma2": 2, "gemma3_text": 3}[model_type]
    if config.get("use_bidirectional_attention"):
        raise UnsupportedArchitectureError(
            f"use_bidirectional_attention=true is not implemented for {model_type!r} by the own engine",
            setting="use_bidirectional_attention",
        )
    heads = int(config["num_attention_heads"])
    head_dim = whole(config, "head_dim", int(config["hidden_size"]) // heads)
    layers = int(config["num_hidden_layers"])
    act = text(config, "hidden_act", "gelu_pytorch_tanh")
    if generation > 1:  # Gemma 2 and 3 read hidden_activation (older configs: hidden_act)
        act = text(config, "hidden_activation", act)
    fields: dict[str, Any] = {"hidden_act": act}
    if generation >= 2:
        # An absent key is transformers' class default (256), not "unset".
        fields["scale"] = number(config, "query_pre_attn_scalar", 256, above=0.0) ** -0.5
    if generation == 2:
        # Gemma 3 configs carry attn_logit_softcapping too, but transformers' Gemma 3
        # attention never applies it (measured: applying it differs by 0.1); nor do we.
        # c·tanh(s/c): absent is transformers' default cap of 50.0, null is no cap, 0 divides by 0.
        if "attn_logit_softcapping" not in config:
            fields["softcap"] = 50.0
        elif config["attn_logit_softcapping"] is not None:
            fields["softcap"] = number(config, "attn_logit_softcapping", 50.0, above=0.0)
    if generation == 3:
        types = sequence(config, "layer_types", default_layer_types(config, model_type, layers))
        per_type = {**config, "rope_parameters": gemma3_rope_parameters(config)}
        fields["ropes"] = tuple(rope_config(per_type, head_dim, layer_type=kind) for kind in types)
    base = LlamaConfig.from_dict(config, **fields)
    return GemmaDecoder(GemmaConfig(**{**vars(base), "generation": generation}))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    *QK_NORM_RULES,
    # Gemma 1 calls its pre-MLP norm post_attention_layernorm (Llama's name); Gemma 2/3 use
    # that name for the norm after attention. convert() renames it for Gemma 1.
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.post_attn_norm.weight"),
    (r"layers\.(\d+)\.pre_feedforward_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.post_feedforward_layernorm\.weight", r"blocks.\1.post_mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"norm\.weight", r"final_norm.weight"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    if config.get("model_type", "gemma") != "gemma":
        return tensors
    return {name.replace(".post_attn_norm.", ".mlp_norm."): t for name, t in tensors.items()}
