"""Phi-3: the Llama stack with fused projections and partial, LongRoPE-scaled rotary
embeddings.

Checkpoint quirks handled in ``convert``:
* ``qkv_proj`` is W^Q, W^K and W^V stacked into one (H·D + 2·G·D, E) matrix, split
  here into our per-role projections;
* ``gate_up_proj`` is W_gate and W_up stacked into one (2·I, E) matrix, split likewise.
Rotary: only the first ``partial_rotary_factor``·D dims of each head rotate; the
long-context checkpoints use ``rope_type`` longrope (older configs say su or yarn, which
transformers reads as longrope too), with a top-level ``original_max_position_embeddings``.
Sliding window: ``sliding_window`` on every layer when set.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from . import llama
from .fields import whole
from .llama import LlamaConfig, LlamaDecoder
from .rope import rope_config

MODEL_TYPES = ("phi3",)
PREFIXES = llama.PREFIXES


def build(config: dict[str, Any]) -> LlamaDecoder:
    heads = int(config["num_attention_heads"])
    head_dim = whole(config, "head_dim", int(config["hidden_size"]) // heads)
    rope = rope_config(config, head_dim, partial_rotary=True, aliases={"su": "longrope", "yarn": "longrope"})
    layers = int(config["num_hidden_layers"])
    return LlamaDecoder(LlamaConfig.from_dict(config, ropes=(rope,) * layers, qkv_bias=False, o_bias=False))


RULES = (
    *llama.RULES,
    (r"layers\.(\d+)\.self_attn\.qkv_proj\.weight", r"blocks.\1.attn.qkv_proj.weight"),  # split in convert()
    (r"layers\.(\d+)\.mlp\.gate_up_proj\.weight", r"blocks.\1.mlp.gate_up.weight"),  # split in convert()
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split the fused qkv_proj into q/k/v and gate_up_proj into gate/up."""
    heads = int(config["num_attention_heads"])
    kv_heads = whole(config, "num_key_value_heads", heads)
    head_dim = whole(config, "head_dim", int(config["hidden_size"]) // heads)
    sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(".attn.qkv_proj.weight"):
            prefix = name.removesuffix("qkv_proj.weight")
            # Rows [0, H·D) are W^Q, then G·D rows of W^K, then G·D of W^V.
            for role, part in zip("qkv", tensor.split(sizes, dim=0), strict=True):
                out[f"{prefix}{role}_proj.weight"] = part.contiguous()
        elif name.endswith(".mlp.gate_up.weight"):
            prefix = name.removesuffix("gate_up.weight")
            gate, up = tensor.chunk(2, dim=0)  # transformers: gate, up = gate_up_proj(x).chunk(2)
            out[f"{prefix}gate.weight"], out[f"{prefix}up.weight"] = gate.contiguous(), up.contiguous()
        else:
            out[name] = tensor
    return out
