"""ERNIE 4.5 MoE (``ernie4_5_moe``: ERNIE-4.5-21B-A3B, -300B-A47B): ERNIE 4.5's attention
over a softmax router that chooses with a correction bias, and shared experts.

Deltas from ernie4_5.py and grouped_moe.py:

    p        = softmax(x · W_routerᵀ)                    (float32) over the X experts
    top      the k = ``moe_k`` largest p + b (b: ``e_score_correction_bias``, used to choose
             only); their weights are p, divided by max(Σ p, ``moe_norm_min``)
    MoE(x)   = Σ_{e in top} w_e · SwiGLU_e(x) + SwiGLU_shared(x)    shared:
             ``moe_num_shared_experts``·``moe_intermediate_size`` wide (none at 0), biased
             with ``use_bias`` as the dense MLPs are; the routed experts never are
    layers   the experts on layers ``moe_layer_start_index``..``moe_layer_end_index``
             (-1: the last) whose number + 1 is a multiple of ``moe_layer_interval``; a
             dense SwiGLU of ``intermediate_size`` elsewhere; ``use_bias`` on the dense ones

torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from . import llama
from .ernie4_5 import Ernie45Decoder
from .fields import number, whole
from .grouped_moe import GroupedMoE
from .llama import LlamaConfig, SwiGLU
from .moe import convert as moe_convert

MODEL_TYPES = ("ernie4_5_moe",)
PREFIXES = llama.PREFIXES


class ErnieRouter(nn.Module):
    """Softmax scores, chosen with the correction bias, weighed and normalised without it."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, norm_min: float) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"moe_k={top_k} must be between 1 and the {num_experts} experts")
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(1, num_experts), requires_grad=False)
        self.top_k, self.norm_min = top_k, norm_min

    def forward(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """flat (T, E) -> the chosen experts (T, k) and their weights (T, k)."""
        probs = torch.softmax(nn.functional.linear(flat.float(), self.weight.float()), dim=1)  # (T, X)
        chosen = torch.topk(probs + self.e_score_correction_bias.squeeze(), self.top_k, dim=-1)[1]  # (T, k)
        weights = torch.gather(probs, dim=-1, index=chosen)
        weights = weights / torch.clamp(weights.sum(dim=-1, keepdim=True), min=self.norm_min)
        return chosen, weights.to(flat.dtype)


@dataclass(frozen=True)
class Ernie45MoeConfig(LlamaConfig):
    sparse_layers: tuple[int, ...] = ()
    num_experts: int = 1
    top_k: int = 1
    moe_intermediate_size: int = 1
    shared_experts: int = 0
    norm_min: float = 1e-12


class Ernie45MoeDecoder(Ernie45Decoder):
    config: Ernie45MoeConfig

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        if layer not in c.sparse_layers:
            return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias)
        inner = c.moe_intermediate_size
        router = ErnieRouter(c.hidden_size, c.num_experts, c.top_k, c.norm_min)
        shared = inner * c.shared_experts
        return GroupedMoE(router, c.num_experts, c.hidden_size, inner, shared, c.hidden_act, c.mlp_bias)


def build(config: dict[str, Any]) -> Ernie45MoeDecoder:
    layers = int(config["num_hidden_layers"])
    start = int(config.get("moe_layer_start_index", 1))
    end = int(config.get("moe_layer_end_index", -1))
    end = layers - 1 if end == -1 else end
    interval = whole(config, "moe_layer_interval", 1)
    sparse = tuple(i for i in range(layers) if (i + 1) % interval == 0 and start <= i <= end)
    bias = bool(config.get("use_bias", False))
    base = LlamaConfig.from_dict(config, qkv_bias=bias, o_bias=bias, mlp_bias=bias)
    return Ernie45MoeDecoder(
        Ernie45MoeConfig(
            **vars(base),
            sparse_layers=sparse,
            num_experts=whole(config, "moe_num_experts", config.get("num_experts")),
            top_k=whole(config, "moe_k", config.get("num_experts_per_tok")),
            moe_intermediate_size=int(config["moe_intermediate_size"]),
            shared_experts=whole(config, "moe_num_shared_experts", 0, low=0),
            norm_min=number(config, "moe_norm_min", 1e-12, low=0.0),
        )
    )


RULES = (
    *llama.RULES,
    (r"layers\.(\d+)\.mlp\.gate\.weight", r"blocks.\1.mlp.router.weight"),
    (
        r"layers\.(\d+)\.mlp\.(?:gate\.)?moe_statics\.e_score_correction_bias",  # saved beside the gate
        r"blocks.\1.mlp.router.e_score_correction_bias",
    ),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.experts.\2.\3.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.experts.\2"),  # split in convert()
    (r"layers\.(\d+)\.mlp\.shared_experts\.(gate|up|down)_proj\.(weight|bias)", r"blocks.\1.mlp.shared.\2.\3"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split transformers' fused in-memory expert layout, if that is what was saved (moe.py)."""
    return moe_convert(tensors, config)
