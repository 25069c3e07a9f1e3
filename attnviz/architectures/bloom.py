"""BLOOM (BigScience's BLOOM and BLOOMZ, 560M ... 176B): a causal pre-LayerNorm decoder
with ALiBi instead of position embeddings and a LayerNorm right after the embeddings.

    x_0 = LN_emb(W_tok[ids])                   (no position embedding: see alibi.py)
    h = LN_1(x);  a = Attn(h) + r_1            r_1 = h if apply_residual_connection_post_layernorm else x
    g = LN_2(a);  x = MLP(g) + r_2             r_2 = g if ... else a
    out = LN_f(x)

    attention  score_ij = q_i·k_j / √D + m_h · j (ALiBi), causal; biases on the fused
               q/k/v and on W^O (``dense``)
    MLP(x)     = W_4h→h · GELU(W_h→4h · x), 4E wide, GELU as BLOOM's own tanh form
               x·0.5·(1 + tanh(0.79788456·x·(1 + 0.044715·x²)))

Where the checkpoint differs from our modules (``convert``): ``query_key_value`` is
fused head by head, [q_0 k_0 v_0 | q_1 ...] of D rows each (transformers' view
(B, S, H, 3, D)), split into per-role projections. ``pretraining_tp`` with
``slow_but_exact`` sums W^O in slices: the same products in another order, within
float32 rounding. No length limit: ALiBi extrapolates, and BLOOM configs name none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import Mask, QKTransform
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from .alibi import AlibiAttention
from .base import config_value
from .blocks import split_per_head
from .decoder import DecoderModel
from .fields import number

MODEL_TYPES = ("bloom",)
PREFIXES = ("transformer.",)


@dataclass(frozen=True)
class BloomConfig:
    vocab_size: int
    hidden_size: int
    n_layer: int
    n_head: int
    layer_norm_epsilon: float = 1e-5
    apply_residual_connection_post_layernorm: bool = False

    def __post_init__(self) -> None:
        if self.hidden_size % self.n_head:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by n_head={self.n_head}")

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> BloomConfig:
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(config_value(config, "hidden_size", "n_embed")),
            n_layer=int(config_value(config, "n_layer", "num_hidden_layers")),
            n_head=int(config_value(config, "n_head", "num_attention_heads")),
            layer_norm_epsilon=number(config, "layer_norm_epsilon", 1e-5, above=0.0),
            apply_residual_connection_post_layernorm=bool(config.get("apply_residual_connection_post_layernorm")),
        )


def bloom_gelu(x: Tensor) -> Tensor:
    """BLOOM's GELU, written as transformers' ``bloom_gelu_forward`` (its constants, its order)."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


class BloomMLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc_in = nn.Linear(hidden, 4 * hidden)
        self.fc_out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc_out(bloom_gelu(self.fc_in(x)))


class BloomBlock(nn.Module):
    def __init__(self, c: BloomConfig) -> None:
        super().__init__()
        e = c.hidden_size
        self.attn_norm = nn.LayerNorm(e, eps=c.layer_norm_epsilon)
        self.attn = AlibiAttention(e, c.n_head, bias=True)
        self.mlp_norm = nn.LayerNorm(e, eps=c.layer_norm_epsilon)
        self.mlp = BloomMLP(e)
        self.post_norm_residual = c.apply_residual_connection_post_layernorm

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        # 1. Attention on the normed input; the residual is the input, or its norm.
        h = self.attn_norm(x)  # (B, S, E)
        a, weights = self.attn(h, mask=mask, qk_transform=qk_transform, request=request)  # (B, S, E), (B, H, R, S)
        a = (h if self.post_norm_residual else x) + tap("attn_out", a)
        # 2. The MLP likewise.
        g = self.mlp_norm(a)
        return (g if self.post_norm_residual else a) + tap("mlp_out", self.mlp(g)), weights


class BloomDecoder(DecoderModel):
    def __init__(self, c: BloomConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.n_layer
        self.num_heads = self.num_kv_heads = c.n_head
        self.causal = True
        self.max_positions = None  # ALiBi: no position table, no limit
        self.windows = [None] * c.n_layer
        self.tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon)
        self.blocks = nn.ModuleList(BloomBlock(c) for _ in range(c.n_layer))
        self.final_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon)

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.embed_norm(self.tokens(input_ids))  # (B, S, E)


def build(config: dict[str, Any]) -> BloomDecoder:
    return BloomDecoder(BloomConfig.from_dict(config))


RULES = (
    (r"word_embeddings\.weight", r"tokens.weight"),
    (r"word_embeddings_layernorm\.(weight|bias)", r"embed_norm.\1"),
    (r"h\.(\d+)\.input_layernorm\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"h\.(\d+)\.self_attention\.query_key_value\.(weight|bias)", r"blocks.\1.attn.qkv.\2"),  # split in convert()
    (r"h\.(\d+)\.self_attention\.dense\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"h\.(\d+)\.post_attention_layernorm\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"h\.(\d+)\.mlp\.dense_h_to_4h\.(weight|bias)", r"blocks.\1.mlp.fc_in.\2"),
    (r"h\.(\d+)\.mlp\.dense_4h_to_h\.(weight|bias)", r"blocks.\1.mlp.fc_out.\2"),
    (r"ln_f\.(weight|bias)", r"final_norm.\1"),
    # Dropped: lm_head (tied to the word embeddings).
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split each head-interleaved ``query_key_value`` into q_proj, k_proj and v_proj."""
    c = BloomConfig.from_dict(config)
    head_dim = c.hidden_size // c.n_head
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if ".attn.qkv." in name:
            prefix, kind = name.split(".attn.qkv.")
            for role, part in zip("qkv", split_per_head(tensor, c.n_head, head_dim), strict=True):
                out[f"{prefix}.attn.{role}_proj.{kind}"] = part
        else:
            out[name] = tensor
    return out
