"""OPT (Meta's OPT-125M ... 66B, the Galactica layout): a causal LayerNorm decoder with
learned absolute positions read at an offset of 2, in a pre- or a post-norm variant.

    pre-norm (do_layer_norm_before, every size but 350M):
        x = x + Attn(LN_1(x));   x = x + MLP(LN_2(x));   h = P_out(LN_f(x))
    post-norm (OPT-350M):
        x = LN_1(x + Attn(x));   x = LN_2(x + MLP(x));   h = P_out(x)

    embeddings   x_0 = P_in(W_tok[ids]) + W_pos[position + 2]: the position table has
                 max_position_embeddings + 2 rows and row p + 2 holds position p
                 (positions are cumsum(mask) - 1, so 0..n-1 for right-padded text)
    P_in, P_out  project_in / project_out: bias-free maps between word_embed_proj_dim
                 and hidden_size when they differ (OPT-350M embeds 512 wide, runs 1024)
    attention    q = (W^Q·x + b)·D^-1/2 before q·kᵀ (scaled on the projection, as
                 transformers does, so the scores round alike); biases (enable_bias)
    MLP(x)       = fc2 · ReLU(fc1 · x)
    LN           with or without weight and bias (layer_norm_elementwise_affine); no
                 final norm in the post-norm variant or with _remove_final_layer_norm
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention, QKTransform
from .blocks import MLP, PostNormBlock
from .decoder import DecoderModel, PreNormBlock
from .fields import text, whole

MODEL_TYPES = ("opt",)
PREFIXES = ("model.decoder.", "decoder.")

POSITION_OFFSET = 2  # OPT's position table reserves its first two rows


@dataclass(frozen=True)
class OPTConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    ffn_dim: int
    max_position_embeddings: int
    word_embed_proj_dim: int
    do_layer_norm_before: bool = True
    remove_final_layer_norm: bool = False
    activation_function: str = "relu"
    enable_bias: bool = True
    layer_norm_elementwise_affine: bool = True

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> OPTConfig:
        hidden = int(config["hidden_size"])
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=int(config["num_attention_heads"]),
            ffn_dim=int(config["ffn_dim"]),
            max_position_embeddings=whole(config, "max_position_embeddings", 2048),
            word_embed_proj_dim=whole(config, "word_embed_proj_dim", hidden),
            do_layer_norm_before=bool(config.get("do_layer_norm_before", True)),
            remove_final_layer_norm=bool(config.get("_remove_final_layer_norm", False)),
            activation_function=text(config, "activation_function", "relu"),
            enable_bias=bool(config.get("enable_bias", True)),
            layer_norm_elementwise_affine=bool(config.get("layer_norm_elementwise_affine", True)),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def projected(self) -> bool:
        return self.word_embed_proj_dim != self.hidden_size


class OutputHead(nn.Module):
    """The final norm (pre-norm OPT only), then project_out (when embeddings are narrower)."""

    def __init__(self, norm: nn.Module | None, project: nn.Module | None) -> None:
        super().__init__()
        self.norm, self.project = norm, project

    def forward(self, x: Tensor) -> Tensor:
        if self.norm is not None:
            x = self.norm(x)
        return x if self.project is None else self.project(x)  # (B, S, E_word)


class OPTDecoder(DecoderModel):
    def __init__(self, c: OPTConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.num_hidden_layers
        self.num_heads = self.num_kv_heads = c.num_attention_heads
        self.causal = True
        self.max_positions = c.max_position_embeddings
        self.windows = [None] * c.num_hidden_layers
        self.tokens = nn.Embedding(c.vocab_size, c.word_embed_proj_dim)
        self.positions = nn.Embedding(c.max_position_embeddings + POSITION_OFFSET, c.hidden_size)
        self.project_in = nn.Linear(c.word_embed_proj_dim, c.hidden_size, bias=False) if c.projected else None
        block = PreNormBlock if c.do_layer_norm_before else PostNormBlock
        self.blocks = nn.ModuleList(
            block(
                # scale 1.0 on the scores: the 1/√D is applied to q itself (qk_transforms).
                MultiHeadAttention(c.hidden_size, c.num_attention_heads, bias=c.enable_bias, scale=1.0),
                self.make_norm(),
                MLP(c.hidden_size, c.ffn_dim, c.activation_function, bias=c.enable_bias),
                self.make_norm(),
            )
            for _ in range(c.num_hidden_layers)
        )
        final = self.make_norm() if c.do_layer_norm_before and not c.remove_final_layer_norm else None
        project_out = nn.Linear(c.hidden_size, c.word_embed_proj_dim, bias=False) if c.projected else None
        self.final_norm = OutputHead(final, project_out)

    def make_norm(self) -> nn.LayerNorm:
        c = self.config
        return nn.LayerNorm(c.hidden_size, elementwise_affine=c.layer_norm_elementwise_affine)

    def embed(self, input_ids: Tensor) -> Tensor:
        # Right padding: every real token's position is its index (cumsum(mask) - 1).
        positions = torch.arange(input_ids.size(1), device=input_ids.device) + POSITION_OFFSET  # (S,)
        x = self.tokens(input_ids)  # (B, S, E_word)
        if self.project_in is not None:
            x = self.project_in(x)  # (B, S, E)
        return x + self.positions(positions)

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        scale = self.config.head_dim**-0.5

        def scale_q(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            return q * scale, k  # (B, H, L, D): (W^Q·x + b)·D^-1/2, as transformers

        return [scale_q] * self.num_layers


def build(config: dict[str, Any]) -> OPTDecoder:
    return OPTDecoder(OPTConfig.from_dict(config))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"embed_positions\.weight", r"positions.weight"),
    (r"project_in\.weight", r"project_in.weight"),
    (r"project_out\.weight", r"final_norm.project.weight"),
    (r"final_layer_norm\.(weight|bias)", r"final_norm.norm.\1"),
    (r"layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"layers\.(\d+)\.self_attn_layer_norm\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"layers\.(\d+)\.fc1\.(weight|bias)", r"blocks.\1.mlp.fc_in.\2"),
    (r"layers\.(\d+)\.fc2\.(weight|bias)", r"blocks.\1.mlp.fc_out.\2"),
    (r"layers\.(\d+)\.final_layer_norm\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    # Dropped: lm_head (tied to embed_tokens or not).
)
