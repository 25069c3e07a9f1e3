"""Phi-1, Phi-1.5 and Phi-2 (Microsoft): GPT-J's parallel block on the Llama machinery,
with partial rotary embeddings and an optional LayerNorm on each head's q and k; a
declared delta of ``LlamaDecoder``.

    h = LN(x)
    x = Attn(h) + MLP(h) + x                  (one norm a layer, parallel residual)
    out = LN_f(x)

    RoPE        rotate_half on the first R = partial_rotary_factor·D dims (0.5 in Phi-1/1.5,
                0.4 in Phi-2; 0.5 when a config names none, as transformers); scaled
                variants as rope.py
    qk_layernorm  q_h = LN_q(x·W_h^Q), k = LN_k(x·W^K) over the head dim, one (D,) weight
                and bias shared by all heads, before RoPE
    attention   biases on q/k/v and W^O (``dense``); grouped kv heads when configured
    MLP(x)      = fc2 · GELU_tanh(fc1 · x), with biases
    LN          LayerNorm with weight and bias, eps = layer_norm_eps
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..nn.attention import MultiHeadAttention
from .blocks import MLP, ParallelBlock
from .fields import number, text, whole
from .llama import LlamaConfig, LlamaDecoder, attention_options
from .qwen3 import QKNormAttention
from .rope import rope_config, rope_parameters

MODEL_TYPES = ("phi",)
PREFIXES = ("model.",)


class PhiDecoder(LlamaDecoder):
    def __init__(self, c: LlamaConfig, layer_norm_eps: float, qk_layernorm: bool) -> None:
        self.layer_norm_eps, self.qk_layernorm = layer_norm_eps, qk_layernorm
        super().__init__(c)

    def make_norm(self, dim: int) -> nn.Module:
        return nn.LayerNorm(dim, eps=self.layer_norm_eps)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        if not self.qk_layernorm:
            return super().make_attention(layer)
        return QKNormAttention(
            c.hidden_size,
            c.num_attention_heads,
            **attention_options(c),
            q_norm=self.make_norm(c.head_dim),
            k_norm=self.make_norm(c.head_dim),
        )

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        return MLP(c.hidden_size, c.intermediate_size, c.hidden_act, bias=True)

    def make_block(self, layer: int) -> nn.Module:
        attn, norm = self.make_attention(layer), self.make_norm(self.config.hidden_size)
        return ParallelBlock(attn, norm, self.make_mlp(layer), None, order="attn+mlp+x")


def build(config: dict[str, Any]) -> PhiDecoder:
    params = rope_parameters(config)
    params.setdefault("partial_rotary_factor", config.get("partial_rotary_factor", 0.5))
    config = {**config, "rope_parameters": params}
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    head_dim = whole(config, "head_dim", hidden // heads)
    layers = int(config["num_hidden_layers"])
    c = LlamaConfig.from_dict(
        config,
        head_dim=head_dim,
        hidden_act=text(config, "hidden_act", "gelu_new"),
        qkv_bias=True,
        o_bias=True,
        ropes=(rope_config(config, head_dim, partial_rotary=True),) * layers,
        windows=(None,) * layers,
    )
    eps = number(config, "layer_norm_eps", 1e-5, above=0.0)
    return PhiDecoder(c, eps, qk_layernorm=bool(config.get("qk_layernorm", False)))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.self_attn\.dense\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"layers\.(\d+)\.self_attn\.([qk])_layernorm\.(weight|bias)", r"blocks.\1.attn.\2_norm.\3"),
    (r"layers\.(\d+)\.mlp\.fc1\.(weight|bias)", r"blocks.\1.mlp.fc_in.\2"),
    (r"layers\.(\d+)\.mlp\.fc2\.(weight|bias)", r"blocks.\1.mlp.fc_out.\2"),
    (r"final_layernorm\.(weight|bias)", r"final_norm.\1"),
    # Dropped: lm_head.
)
