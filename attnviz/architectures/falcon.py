"""Falcon (TII's Falcon-7B, -40B, -180B, their instruct models, and Falcon-RW): a causal
LayerNorm decoder with rotary embeddings (or ALiBi), multi-query or grouped-query
attention and a parallel block; two architectures, as config.json's switches choose them.

    new_decoder_architecture (40B, 180B):
        x = MLP(LN_mlp(x)) + Attn(LN_attn(x)) + x       (num_ln_in_parallel_attn 2, the
                                                         default; with 1, one norm feeds both)
        G = num_kv_heads key/value heads, each serving H/G query heads
    old (7B, RW):
        parallel_attn:      x = MLP(LN(x)) + Attn(LN(x)) + x    (one norm)
        not parallel_attn:  a = x + Attn(LN_1(x));  x = a + MLP(LN_2(a))
        multi_query: one key/value head for all H query heads (else H of them)
    h = LN_f(x)

    attention  softmax(q·kᵀ / √D) with RoPE (rotate_half, every head dim; scaled variants
               as rope.py); biases on q/k/v and W^O only with ``bias``
    alibi      (Falcon-RW) no RoPE: softmax(q·kᵀ / √D + bf16(m_h · j) / √D), the ALiBi
               slopes m_h times the key position rounded to bfloat16 as transformers'
               ``build_alibi_tensor`` rounds it, then cast and divided by √D (alibi.py);
               no length limit. With any of the layouts above: transformers allows each.
    MLP(x)     = W_4h→h · act(W_h→4h · x), ffn_hidden_size wide (4E by default)

Where the checkpoint differs from our modules (``convert``): ``query_key_value`` is
fused as transformers' ``_split_heads`` reads it:
    new architecture  per key/value group g: its H/G query heads, then k_g, then v_g
    multi_query       the H query heads, then the one k, then the one v
    otherwise         head by head, [q_0 k_0 v_0 | q_1 ...]

ALiBi is exact to transformers from 5.25 on, whose eager and SDPA paths both add the bias
once, through the float mask. Before 5.25 its eager path added it twice (in the scores and
again through the mask; 0.06 apart from its SDPA path in the hidden states of a tiny
checkpoint), so the hf engine refuses ALiBi Falcon there (engines/hf_model.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention, QKTransform
from .alibi import AlibiAttention
from .base import config_value
from .blocks import MLP, ParallelBlock, split_per_head
from .decoder import PreNormBlock
from .fields import number, text, whole
from .llama import LlamaConfig, LlamaDecoder, attention_options
from .rope import rope_config

MODEL_TYPES = ("falcon",)
PREFIXES = ("transformer.",)


def layout(config: dict[str, Any]) -> tuple[str, int, int, int]:
    """("new" | "multi_query" | "per_head", H, G, D) of a Falcon config.

    Raises:
        ValueError: switches transformers itself cannot run.
    """
    heads = int(config_value(config, "num_attention_heads", "n_head"))
    hidden = int(config_value(config, "hidden_size", "n_embed"))
    if hidden % heads:
        raise ValueError(f"hidden_size={hidden} is not divisible by num_attention_heads={heads}")
    kv = whole(config, "num_kv_heads", heads)
    if config.get("new_decoder_architecture"):
        if not config.get("parallel_attn", True):
            raise ValueError("new_decoder_architecture needs parallel_attn (transformers has no other block for it)")
        if heads % kv:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of num_kv_heads={kv}")
        return "new", heads, kv, hidden // heads
    if config.get("multi_query", True):
        return "multi_query", heads, 1, hidden // heads
    if kv != heads:
        raise ValueError(f"num_kv_heads={kv} needs new_decoder_architecture or multi_query (heads: {heads})")
    return "per_head", heads, heads, hidden // heads


class FalconDecoder(LlamaDecoder):
    def __init__(self, c: LlamaConfig, config: dict[str, Any]) -> None:
        self.kind = layout(config)[0]
        self.layer_norm_epsilon = number(config, "layer_norm_epsilon", 1e-5, above=0.0)
        self.parallel = bool(config.get("parallel_attn", True))
        self.two_norms = self.kind == "new" and whole(config, "num_ln_in_parallel_attn", 2) == 2
        self.alibi = bool(config.get("alibi"))
        super().__init__(c)
        if self.alibi:
            self.max_positions = None  # ALiBi: no position table, no limit (as BLOOM)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        if not self.alibi:
            return super().make_attention(layer)
        c = self.config
        # transformers: alibi / math.sqrt(head_dim), added to the scores after their scaling.
        divisor = math.sqrt(c.head_dim)
        return AlibiAttention(
            c.hidden_size, c.num_attention_heads, **attention_options(c), slope_dtype=torch.bfloat16, divisor=divisor
        )

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        if self.alibi:
            return [None] * self.num_layers  # positions enter through the score bias alone
        return super().qk_transforms(input_ids, x)

    def make_norm(self, dim: int) -> nn.Module:
        return nn.LayerNorm(dim, eps=self.layer_norm_epsilon)

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        return MLP(c.hidden_size, c.intermediate_size, c.hidden_act, bias=c.qkv_bias)

    def make_block(self, layer: int) -> nn.Module:
        e = self.config.hidden_size
        attn, attn_norm, mlp = self.make_attention(layer), self.make_norm(e), self.make_mlp(layer)
        if not self.parallel:
            return PreNormBlock(attn, attn_norm, mlp, self.make_norm(e))
        return ParallelBlock(attn, attn_norm, mlp, self.make_norm(e) if self.two_norms else None, order="mlp+attn+x")


def build(config: dict[str, Any]) -> FalconDecoder:
    _, heads, kv, head_dim = layout(config)
    hidden = heads * head_dim
    layers = int(config_value(config, "num_hidden_layers", "n_layer"))
    bias = bool(config.get("bias", False))
    inner = whole(config, "ffn_hidden_size", 4 * hidden)
    names = {"hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers}
    c = LlamaConfig.from_dict(
        {**config, **names, "intermediate_size": inner},
        num_key_value_heads=kv,
        head_dim=head_dim,
        hidden_act=text(config, "activation", "gelu"),
        qkv_bias=bias,
        o_bias=bias,
        ropes=(rope_config(config, head_dim),) * layers,
        windows=(None,) * layers,
        scale=1.0 / math.sqrt(head_dim),  # transformers' inv_norm_factor, the same double
    )
    return FalconDecoder(c, config)


RULES = (
    (r"word_embeddings\.weight", r"tokens.weight"),
    (r"h\.(\d+)\.(?:input_layernorm|ln_attn)\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"h\.(\d+)\.(?:post_attention_layernorm|ln_mlp)\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"h\.(\d+)\.self_attention\.query_key_value\.(weight|bias)", r"blocks.\1.attn.qkv.\2"),  # split in convert()
    (r"h\.(\d+)\.self_attention\.dense\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"h\.(\d+)\.mlp\.dense_h_to_4h\.(weight|bias)", r"blocks.\1.mlp.fc_in.\2"),
    (r"h\.(\d+)\.mlp\.dense_4h_to_h\.(weight|bias)", r"blocks.\1.mlp.fc_out.\2"),
    (r"ln_f\.(weight|bias)", r"final_norm.\1"),
    # Dropped: lm_head (tied to the word embeddings or not).
)


def split_qkv(fused: Tensor, kind: str, heads: int, kv: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """q (H·D, ...), k and v (G·D, ...) rows of a fused Falcon weight (rows, E) or bias (rows,)."""
    rest = fused.shape[1:]
    if kind == "per_head":
        q, k, v = split_per_head(fused, heads, head_dim)
        return q, k, v
    if kind == "multi_query":
        q, k, v = torch.split(fused, [heads * head_dim, head_dim, head_dim], dim=0)
        return q.contiguous(), k.contiguous(), v.contiguous()
    group = heads // kv
    grouped = fused.reshape(kv, group + 2, head_dim, *rest)  # (G, H/G + 2, D, ...)
    q = grouped[:, :group].reshape(heads * head_dim, *rest)  # query heads g·H/G .. of group g, in order
    k, v = grouped[:, group].reshape(kv * head_dim, *rest), grouped[:, group + 1].reshape(kv * head_dim, *rest)
    return q.contiguous(), k.contiguous(), v.contiguous()


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split each fused ``query_key_value`` into q_proj, k_proj and v_proj by its layout."""
    kind, heads, kv, head_dim = layout(config)
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if ".attn.qkv." in name:
            prefix, part = name.split(".attn.qkv.")
            for role, piece in zip("qkv", split_qkv(tensor, kind, heads, kv, head_dim), strict=True):
                out[f"{prefix}.attn.{role}_proj.{part}"] = piece
        else:
            out[name] = tensor
    return out
