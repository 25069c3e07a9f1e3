"""Decoder pieces the families of GPT-NeoX's lineage share beyond decoder.py's pre-norm
block: the parallel block, the two-matrix MLP, and splitting a fused q/k/v projection.

    parallel   x = x + Attn(Norm_1(x)) + MLP(Norm_2(x))    (GPT-NeoX, Falcon-40B)
               x = x + Attn(Norm(x))   + MLP(Norm(x))      (GPT-J, Phi, Falcon-7B:
                                                            one norm feeds both)
    MLP(x)     = W_out · act(W_in · x)

A module of helpers, not a family: it declares no MODEL_TYPES. torch only.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..nn.attention import Mask, MultiHeadAttention, QKTransform
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from .base import activation


class ParallelBlock(nn.Module):
    """Attention and MLP read the same residual stream and are added to it together.

    ``mlp_norm`` None: the attention's norm feeds the MLP too (one LayerNorm a layer).
    ``attn_out`` / ``mlp_out`` are the sums' order as transformers writes it: the same
    three terms, added left to right, so float32 rounds alike.
    """

    def __init__(
        self,
        attn: MultiHeadAttention,
        attn_norm: nn.Module,
        mlp: nn.Module,
        mlp_norm: nn.Module | None = None,
        order: str = "mlp+attn+x",
    ) -> None:
        super().__init__()
        if order not in ("mlp+attn+x", "attn+mlp+x", "x+attn+mlp"):
            raise ValueError(f"unknown sum order {order!r}")
        self.attn_norm, self.attn = attn_norm, attn
        self.mlp_norm, self.mlp = mlp_norm, mlp
        self.order = order

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        # 1. Both sub-layers read the normed input of the layer.
        h = self.attn_norm(x)  # (B, S, E)
        a, weights = self.attn(h, mask=mask, qk_transform=qk_transform, request=request)  # (B, S, E), (B, H, R, S)
        a = tap("attn_out", a)
        m = tap("mlp_out", self.mlp(h if self.mlp_norm is None else self.mlp_norm(x)))  # (B, S, E)
        # 2. One residual update with both.
        if self.order == "mlp+attn+x":
            return m + a + x, weights
        if self.order == "attn+mlp+x":
            return a + m + x, weights
        return x + a + m, weights


class MLP(nn.Module):
    """W_out · act(W_in · x), the GPT-2 lineage's feed-forward layer."""

    def __init__(self, hidden: int, inner: int, act: str, bias: bool = True) -> None:
        super().__init__()
        self.fc_in = nn.Linear(hidden, inner, bias=bias)
        self.fc_out = nn.Linear(inner, hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc_out(self.act(self.fc_in(x)))


def split_per_head(fused: Tensor, heads: int, head_dim: int, parts: int = 3) -> list[Tensor]:
    """A fused projection laid out head by head, [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]
    (GPT-NeoX, BLOOM), as ``parts`` per-role tensors laid out role by role.

    ``fused``: (H·parts·D, E) weight or (H·parts·D,) bias. Returns ``parts`` tensors of
    (H·D, E) or (H·D,): head h's rows of role r are fused rows (h·parts + r)·D ...
    """
    rest = fused.shape[1:]
    grouped = fused.reshape(heads, parts, head_dim, *rest)  # (H, parts, D, ...)
    return [grouped[:, r].reshape(heads * head_dim, *rest).contiguous() for r in range(parts)]


class PostNormBlock(nn.Module):
    """The original Transformer's order: each sub-layer inside the residual, the norm after.

    x = Norm_1(x + Attn(x))
    x = Norm_2(x + MLP(x))
    """

    def __init__(self, attn: MultiHeadAttention, attn_norm: nn.Module, mlp: nn.Module, mlp_norm: nn.Module) -> None:
        super().__init__()
        self.attn, self.attn_norm = attn, attn_norm
        self.mlp, self.mlp_norm = mlp, mlp_norm

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        a, weights = self.attn(x, mask=mask, qk_transform=qk_transform, request=request)  # (B, S, E), (B, H, R, S)
        x = self.attn_norm(x + tap("attn_out", a))
        return self.mlp_norm(x + tap("mlp_out", self.mlp(x))), weights
