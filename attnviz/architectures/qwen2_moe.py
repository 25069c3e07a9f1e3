"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention over moe.py's router, with
a shared expert beside the routed ones.

Deltas from llama.py (qwen2) and moe.py:

    MoE(x)    = Σ_{e in top-k} p_e · SwiGLU_e(x)  +  σ(x · w_gate) · SwiGLU_shared(x)
                the routed part as in moe.py (softmax router in float32, top
                ``num_experts_per_tok``, renormalised only with ``norm_topk_prob``); the
                shared expert (``shared_expert_intermediate_size`` wide) runs on every
                token, scaled by a sigmoid of its own gate, a (1, E) projection
    layers    dense SwiGLU (``intermediate_size``) on ``mlp_only_layers`` and on all but
              every ``decoder_sparse_step``-th layer; experts ``moe_intermediate_size`` wide
    biases    ``qkv_bias`` on q/k/v (default on), none on W^O or the MLPs
    window    ``sliding_window`` on the ``sliding_attention`` layers of ``layer_types``
              (by default the even-indexed layers below ``max_window_layers``, with
              ``use_sliding_window``); transformers 5 saves ``"sliding_window": 0`` when
              windows are off, which then means none

torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .fields import sequence, whole
from .llama import LlamaConfig, SwiGLU
from .moe import RULES as MOE_RULES
from .moe import MoEConfig, MoEDecoder, SparseMoE
from .moe import convert as moe_convert

MODEL_TYPES = ("qwen2_moe",)
PREFIXES = ("model.",)


class SharedExpertMoE(nn.Module):
    """The routed experts plus a shared expert scaled by sigmoid(its gate)."""

    def __init__(self, routed: SparseMoE, hidden: int, shared_inner: int, act: str) -> None:
        super().__init__()
        self.routed = routed
        self.shared = SwiGLU(hidden, shared_inner, act)
        self.shared_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        # In transformers' order: the routed sum, then the gated shared expert added to it.
        shared = torch.sigmoid(self.shared_gate(x)) * self.shared(x)  # (B, S, E)
        return self.routed(x) + shared


@dataclass(frozen=True)
class Qwen2MoeConfig(MoEConfig):
    shared_expert_intermediate_size: int = 1


class Qwen2MoeDecoder(MoEDecoder):
    config: Qwen2MoeConfig

    def make_mlp(self, layer: int) -> nn.Module:
        mlp = super().make_mlp(layer)
        if not isinstance(mlp, SparseMoE):
            return mlp  # a dense layer
        c = self.config
        return SharedExpertMoE(mlp, c.hidden_size, c.shared_expert_intermediate_size, c.hidden_act)


def _windows(config: dict[str, Any], layers: int) -> tuple[int | None, ...]:
    window = config.get("sliding_window")
    on = bool(config.get("use_sliding_window"))
    first = int(config.get("max_window_layers", 28))
    types = sequence(
        config,
        "layer_types",
        ["sliding_attention" if (i + 1) % 2 and i < first and on else "full_attention" for i in range(layers)],
    )
    if len(types) != layers or any(kind not in ("full_attention", "sliding_attention") for kind in types):
        raise ValueError(f"layer_types {types} must name full or sliding attention for each of {layers} layers")
    if "sliding_attention" in types and (window is None or window < 1):
        raise ValueError(f"sliding_attention layers need a sliding_window of at least 1, not {window}")
    size = 0 if window is None else int(window)
    return tuple(size if kind == "sliding_attention" else None for kind in types)


def build(config: dict[str, Any]) -> Qwen2MoeDecoder:
    layers = int(config["num_hidden_layers"])
    experts = int(config["num_experts"])
    step = whole(config, "decoder_sparse_step", 1)
    dense = set(sequence(config, "mlp_only_layers", ()))
    sparse = tuple(i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
    bias = bool(config.get("qkv_bias", True))
    base = LlamaConfig.from_dict(config, qkv_bias=bias, o_bias=False, mlp_bias=False, windows=_windows(config, layers))
    return Qwen2MoeDecoder(
        Qwen2MoeConfig(
            **vars(base),
            model_type="qwen2_moe",
            num_experts=experts,
            num_experts_per_tok=int(config["num_experts_per_tok"]),
            moe_intermediate_size=int(config["moe_intermediate_size"]),
            sparse_layers=sparse,
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            shared_expert_intermediate_size=int(config["shared_expert_intermediate_size"]),
        )
    )


RULES = (
    (r"layers\.(\d+)\.mlp\.shared_expert\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.shared.\2.weight"),
    (r"layers\.(\d+)\.mlp\.shared_expert_gate\.weight", r"blocks.\1.mlp.shared_gate.weight"),
    # The routed experts sit one module deeper than in moe.py's MoE layers.
    (r"layers\.(\d+)\.mlp\.gate\.weight", r"blocks.\1.mlp.routed.router.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.routed.experts.\2.\3.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.routed.experts.\2"),
    *MOE_RULES,
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split transformers' fused in-memory expert layout, if that is what was saved (moe.py)."""
    return moe_convert(tensors, config)
