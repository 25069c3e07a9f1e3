"""DeepSeek Sparse Attention (DSA): DeepSeek-V3.2 (``deepseek_v32``) and GLM-5
(``glm_moe_dsa``). mla.py's latent attention, experts and stack; what changes is which keys
each query may see: a lightweight *indexer* picks the top k of them, and the heads attend
to those alone.

    q^I_i     = W^{IQ} · c^Q_i          per indexer head g (``index_n_heads`` of
                                        ``index_head_dim`` dims), from the query latent
                                        c^Q = RMSNorm(W^{DQ} x) of the attention itself
    k^I_j     = LayerNorm(W^{IK} x_j)   one key per token, shared by the indexer heads
    RoPE      on the first d_rope dims of q^I and k^I: by halves (V3.2), or consecutive
              pairs written as halves (GLM-5), at the attention's own cos/sin
    I_ij      = Σ_g w_ig · ReLU(q^I_ig · k^I_j / √d_I),   w_i = W^w x_i / √(index_n_heads)
    chosen_i  = the ``index_topk`` keys j of largest I_ij among those the causal mask allows
              (every allowed key while there are fewer)
    α_hij     = softmax over chosen_i of q_hi · k_hj · scale;   0 for j not chosen

The indexer's scores are computed in float32, in transformers' order of operations (the
masked keys at the dtype's lowest float, as its additive mask has them), so that the same
keys win, ties included. GLM-5's ``indexer_types`` may mark a layer "shared": it has no
indexer and reuses the keys the last "full" layer before it chose.

So a head's row under the indexer is still a distribution over the keys, but over the k
keys the indexer chose for that query: every other key's weight is exactly 0, as if the
mask hid it. The norms, ablation and explain read heads as in mla.py.

torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn import cache as kv_cache
from ..nn.attention import Mask, MaskLike, MultiHeadAttention
from ..nn.rows import EAGER
from . import mla
from .fields import sequence, whole
from .mla import LatentAttention, MLAConfig, MLADecoder
from .rope import RopeConfig, rotate_half

MODEL_TYPES = ("deepseek_v32", "glm_moe_dsa")
PREFIXES = mla.PREFIXES
RULES = (
    (r"layers\.(\d+)\.self_attn\.indexer\.(wq_b|wk|weights_proj)\.weight", r"blocks.\1.attn.indexer.\2.weight"),
    (r"layers\.(\d+)\.self_attn\.indexer\.k_norm\.(weight|bias)", r"blocks.\1.attn.indexer.k_norm.\2"),
    *mla.RULES,
)
convert = mla.convert


@dataclass(frozen=True)
class DSAConfig(MLAConfig):
    index_n_heads: int = 1
    index_head_dim: int = 2
    index_topk: int = 1
    index_layout: str = "halves"  # the indexer's RoPE: "halves" (V3.2) or "pairs-to-halves" (GLM-5)
    indexer_types: tuple[str, ...] = ()  # per layer: "full" (its own indexer) or "shared"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.q_lora_rank is None:
            raise ValueError("the sparse indexer reads the query latent: q_lora_rank must be set")
        if not 0 < self.qk_rope_head_dim <= self.index_head_dim:
            raise ValueError(f"index_head_dim={self.index_head_dim} must hold qk_rope_head_dim={self.qk_rope_head_dim}")
        if len(self.indexer_types) != self.num_hidden_layers:
            raise ValueError(f"indexer_types names {len(self.indexer_types)} layers, not {self.num_hidden_layers}")
        unknown = sorted(set(self.indexer_types) - {"full", "shared"})
        if unknown:
            raise ValueError(f"indexer_types {unknown} are not 'full' or 'shared'")
        if self.indexer_types and self.indexer_types[0] != "full":
            raise ValueError(
                "the first layer's indexer_types entry must be 'full': a shared layer reuses an earlier one"
            )


class Indexer(nn.Module):
    """The lightning indexer of one layer: its projections, and which keys each query gets."""

    def __init__(self, d_model: int, q_lora_rank: int, heads: int, head_dim: int, rope_dim: int, layout: str) -> None:
        super().__init__()
        self.heads, self.head_dim, self.rope_dim, self.layout = heads, head_dim, rope_dim, layout
        self.wq_b = nn.Linear(q_lora_rank, heads * head_dim, bias=False)  # W^{IQ}
        self.wk = nn.Linear(d_model, head_dim, bias=False)  # W^{IK}
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(d_model, heads, bias=False)  # W^w

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """RoPE on the first d_rope dims of x (B, L, ·, D_I); cos/sin (L, R)."""
        rot, rest = x[..., : self.rope_dim], x[..., self.rope_dim :]
        cos, sin = cos[:, None], sin[:, None]  # (L, 1, R): over the heads
        if self.layout == "halves":
            rot = rot * cos + rotate_half(rot) * sin
        else:  # consecutive pairs (2i, 2i+1), written as halves
            half_cos, half_sin = cos[..., : self.rope_dim // 2], sin[..., : self.rope_dim // 2]
            even, odd = rot[..., 0::2], rot[..., 1::2]
            rot = torch.cat([even * half_cos - odd * half_sin, odd * half_cos + even * half_sin], dim=-1)
        return torch.cat([rot, rest], dim=-1)

    def project(self, x: Tensor, q_latent: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """q^I (B, L, G, D_I) and k^I (B, L, D_I) of the tokens x (B, L, E), rotated."""
        b, length, _ = x.shape
        q = self.wq_b(q_latent).view(b, length, self.heads, self.head_dim)  # (B, L, G, D_I)
        k = self.k_norm(self.wk(x)).unsqueeze(2)  # (B, L, 1, D_I)
        return self.rotate(q, cos, sin), self.rotate(k, cos, sin).squeeze(2)

    def choose(self, x: Tensor, q: Tensor, k: Tensor, allowed: Tensor, topk: int) -> Tensor:
        """(B, 1, L, S) boolean, True at the keys each query's top-k index scores pick among
        the ``allowed`` (B or 1, 1, L, S) ones; x (B, L, E), q (B, L, G, D_I), k (B, S, D_I)."""
        # In transformers' order: per indexer head, ReLU of the scaled scores; then their
        # weighted sum over the heads (a (1, G) @ (G, S) product per query).
        scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.head_dim**-0.5  # (B, L, G, S)
        scores = nn.functional.relu(scores)
        weights = self.weights_proj(x.to(self.weights_proj.weight.dtype)).float() * self.heads**-0.5  # (B, L, G)
        index = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # (B, L, S)
        # The masked keys at the dtype's lowest float, as transformers' additive mask adds it.
        lowest = torch.finfo(x.dtype).min
        index = index + torch.zeros((), dtype=x.dtype, device=x.device).masked_fill(~allowed[:, 0], lowest)
        picked = index.topk(min(topk, index.size(-1)), dim=-1).indices  # (B, L, k)
        chosen = torch.zeros(index.shape, dtype=torch.bool, device=x.device).scatter(-1, picked, True)
        return chosen[:, None]  # (B, 1, L, S)


class IndexedLatentAttention(LatentAttention):
    """``LatentAttention`` whose mask is narrowed, per query, to the keys the indexer picks
    (its own, or a "shared" layer's earlier one, ``source``)."""

    def __init__(self, c: DSAConfig, layer: int, source: IndexedLatentAttention | None) -> None:
        super().__init__(
            c.hidden_size,
            c.num_attention_heads,
            q_lora_rank=c.q_lora_rank,
            kv_lora_rank=c.kv_lora_rank,
            nope_dim=c.qk_nope_head_dim,
            rope_dim=c.qk_rope_head_dim,
            v_dim=c.v_head_dim,
            bias=c.qkv_bias,
            scale=c.scale if c.scale is not None else c.head_dim**-0.5,
        )
        self.rope: RopeConfig = c.rope
        self.topk = c.index_topk
        self.indexer: Indexer | None = None
        # The full layer whose choice a shared layer reuses; a list, so that it is no submodule.
        self.source: list[IndexedLatentAttention] = [] if source is None else [source]
        if source is None:
            if c.q_lora_rank is None:  # transformers' indexer reads the query latent too
                raise UnsupportedArchitectureError(
                    "this checkpoint's top-k indexer reads the low-rank query latent, and its config.json "
                    "sets no q_lora_rank"
                )
            self.indexer = Indexer(
                c.hidden_size,
                c.q_lora_rank,
                c.index_n_heads,
                c.index_head_dim,
                c.qk_rope_head_dim,
                c.index_layout,
            )
        self.chosen: Tensor | None = None  # the last pass's choice (B, 1, L, S), for the shared layers after

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: MaskLike = None,
        qk_transform: Any = None,
        request: Any = EAGER,
        score_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        x = query  # (B, L, E): self-attention (``project`` refuses anything else)
        b, length, _ = x.shape
        cache = kv_cache.active()
        offset = 0 if cache is None else cache.offset()  # the step's first position
        total = offset + length
        allowed = mask.dense(total, x.device) if isinstance(mask, Mask) else mask  # (B or 1, 1, L, S) or None
        if allowed is None:
            allowed = torch.ones(1, 1, length, total, dtype=torch.bool, device=x.device)
        if self.indexer is not None:
            # The query latent, recomputed as the attention computes it (step 1a of project).
            q_latent = self.q_a_norm(self.q_a_proj(x))  # (B, L, q_lora_rank)
            cos, sin = self.rope.cos_sin(total, x)  # (S, R): the attention's own angles
            q, k = self.indexer.project(x, q_latent, cos[offset:], sin[offset:])  # (B, L, G, D_I), (B, L, D_I)
            if cache is not None:
                k = cache.extend("indexer", k)  # (B, S, D_I): every earlier token's indexer key
            chosen = self.indexer.choose(x, q, k, allowed, self.topk)  # (B, 1, L, S)
            self.chosen = chosen
        else:
            reused = self.source[0].chosen
            if reused is None or reused.shape[-2:] != (length, total):
                raise RuntimeError("a shared indexer layer ran before the full layer it reuses")
            chosen = reused
        return super().forward(query, key, value, allowed & chosen, qk_transform, request, score_bias)


class DSADecoder(MLADecoder):
    config: DSAConfig

    def __init__(self, c: DSAConfig) -> None:
        nn.Module.__init__(self)
        # The attention modules built so far, for a shared layer to find its full one (a
        # plain list: the blocks hold and register them).
        self.built: list[IndexedLatentAttention] = []
        super().__init__(c)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        kinds = self.config.indexer_types
        source = None
        if kinds[layer] == "shared":
            source = self.built[max(i for i in range(layer) if kinds[i] == "full")]
        attn = IndexedLatentAttention(self.config, layer, source)
        self.built.append(attn)
        return attn


def build(config: dict[str, Any]) -> DSADecoder:
    model_type = str(config.get("model_type"))
    base = mla.mla_config(config)
    layers = base.num_hidden_layers
    if model_type == "glm_moe_dsa":
        kinds: Sequence[str] = sequence(config, "indexer_types", ["full"] * layers)
    else:
        kinds = ["full"] * layers
    for key in ("index_topk_pattern", "index_topk_freq"):
        if config.get(key) is not None and config.get("indexer_types") is None:
            # transformers turns these into indexer_types when it saves; a hand-written one
            # is not read here.
            raise UnsupportedArchitectureError(f"{key} without indexer_types is not implemented", setting=key)
    return DSADecoder(
        DSAConfig(
            **vars(base),
            index_n_heads=whole(config, "index_n_heads", 64),
            index_head_dim=whole(config, "index_head_dim", 128),
            index_topk=whole(config, "index_topk", 2048),
            index_layout="pairs-to-halves" if model_type == "glm_moe_dsa" else "halves",
            indexer_types=tuple(kinds),
        )
    )
