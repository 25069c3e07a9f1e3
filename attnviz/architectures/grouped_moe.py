"""The mixture of experts of DeepSeek-V3's lineage (GLM-4.5, dots1 ...): sigmoid scores,
a group-limited top-k with a score-correction bias, and shared experts beside the routed.

    s        = σ(x · W_routerᵀ)                      (float32)   X experts, in G groups
    choice   = s + b                                 b: ``e_score_correction_bias``, used to
                                                     choose only, never to weight
    groups   the ``topk_group`` groups whose two best choices sum highest; the experts of
             the other groups are out
    top      the k = ``num_experts_per_tok`` best choices left; their weights are s (not
             choice), divided by their sum (+1e-20) with ``norm_topk_prob``, times
             ``routed_scaling_factor``
    MoE(x)   = Σ_{e in top} w_e · SwiGLU_e(x)  +  SwiGLU_shared(x)

The top-k calls are transformers' own (``sorted=False`` included), so the experts are
summed in the same order and the hidden states agree to the last bits. A module of
helpers, not a family: it declares no MODEL_TYPES. torch only.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .llama import SwiGLU


class GroupedTopkRouter(nn.Module):
    """Which experts each token goes to, and with what weight (see the module docstring)."""

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        groups: int,
        top_groups: int,
        normalize: bool,
        scaling: float,
    ) -> None:
        super().__init__()
        if groups < 1 or num_experts % groups or not 1 <= top_groups <= groups:
            raise ValueError(f"n_group={groups}, topk_group={top_groups} do not divide {num_experts} experts")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be between 1 and the {num_experts} experts")
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))
        self.e_score_correction_bias: Tensor
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))
        self.top_k, self.groups, self.top_groups = top_k, groups, top_groups
        self.normalize, self.scaling = normalize, scaling

    def forward(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """flat (T, E) -> the chosen experts (T, k) and their weights (T, k), float32."""
        x = self.weight.size(0)
        scores = torch.sigmoid(nn.functional.linear(flat.float(), self.weight.float()))  # (T, X)
        choice = scores + self.e_score_correction_bias  # (T, X)
        # 1. The best groups, each scored by the sum of its two best choices.
        group_scores = choice.view(-1, self.groups, x // self.groups).topk(2, dim=-1)[0].sum(dim=-1)  # (T, G)
        best = torch.topk(group_scores, k=self.top_groups, dim=-1, sorted=False)[1]  # (T, g)
        keep = torch.zeros_like(group_scores).scatter_(1, best, 1)  # (T, G)
        keep = keep.unsqueeze(-1).expand(-1, self.groups, x // self.groups).reshape(-1, x)  # (T, X)
        # 2. The best experts of those groups, weighted by their sigmoid scores.
        chosen = torch.topk(choice.masked_fill(~keep.bool(), float("-inf")), k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, chosen)  # (T, k)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return chosen, weights * self.scaling


class GroupedMoE(nn.Module):
    """The routed SwiGLU experts plus ``shared`` (a SwiGLU on every token; none when
    ``shared_inner`` is 0; biased with ``shared_bias``, ERNIE 4.5's). ``router``: flat
    (T, E) -> chosen experts (T, k) and their weights (T, k), ``GroupedTopkRouter`` or a
    family's own (ERNIE 4.5's, Hunyuan's)."""

    def __init__(
        self,
        router: nn.Module,
        num_experts: int,
        hidden: int,
        inner: int,
        shared_inner: int,
        act: str,
        shared_bias: bool = False,
    ) -> None:
        super().__init__()
        self.router = router
        self.experts = nn.ModuleList(SwiGLU(hidden, inner, act) for _ in range(num_experts))
        self.shared = SwiGLU(hidden, shared_inner, act, shared_bias) if shared_inner else None

    def forward(self, x: Tensor) -> Tensor:
        b, s, e = x.shape
        flat = x.reshape(-1, e)  # (T, E)
        chosen, weights = self.router(flat)  # (T, k), (T, k)
        out = torch.zeros_like(flat)  # (T, E)
        for expert, mlp in enumerate(self.experts):
            slot, token = torch.where((chosen == expert).T)  # transformers' order: by slot, then token
            if token.numel():
                out.index_add_(0, token, (mlp(flat[token]) * weights[token, slot, None]).to(out.dtype))
        if self.shared is None:
            return out.reshape(b, s, e)
        shared: Tensor = self.shared(x)  # (B, S, E)
        return out.reshape(b, s, e) + shared
