"""GPT-NeoX (Pythia, GPT-NeoX-20B): a causal LayerNorm decoder with partial rotary
embeddings and, by default, a parallel residual; a declared delta of ``LlamaDecoder``.

    parallel (use_parallel_residual, the default; Pythia):
        x = MLP(LN_2(x)) + Attn(LN_1(x)) + x
    sequential:
        a = Attn(LN_1(x)) + x
        x = MLP(LN_2(a)) + a
    h = LN_f(x)

    LN          LayerNorm with weight and bias (not Llama's RMSNorm)
    RoPE        on the first R = partial_rotary_factor·D dims of each head only
                (0.25 in Pythia), the rest of q and k unrotated; rotate_half pairs
                (i, i + R/2), as Llama; scaled variants as rope.py
    MLP(x)      = W_4h→h · GELU(W_h→4h · x), with biases
    attention   H heads of D = E/H, 1/√D, biases on qkv and the output (attention_bias)

Where the checkpoint differs from our modules (``convert``): ``query_key_value`` is W^Q,
W^K and W^V fused head by head, rows [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] of D each
(the view (B, S, H, 3D) then a split of the last dim), split into our per-role
projections. Older configs name the rotary settings ``rotary_pct`` and
``rotary_emb_base``; they mean partial_rotary_factor and rope_theta (0.25 and 10 000
when absent), as transformers reads them.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .blocks import MLP, ParallelBlock, split_per_head
from .decoder import PreNormBlock
from .llama import LlamaConfig, LlamaDecoder
from .rope import rope_config, rope_parameters

MODEL_TYPES = ("gpt_neox",)
PREFIXES = ("gpt_neox.",)


def neox_rope_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its rope parameters as transformers' GPTNeoXConfig fills them in."""
    params = rope_parameters(config)
    params.setdefault("rope_theta", config.get("rotary_emb_base", 10000.0))
    params.setdefault("partial_rotary_factor", config.get("rotary_pct", 0.25))
    return {**config, "rope_parameters": params}


class GPTNeoXDecoder(LlamaDecoder):
    """LayerNorms, a GELU MLP with biases, parallel or sequential residual."""

    def __init__(self, c: LlamaConfig, layer_norm_eps: float, parallel: bool) -> None:
        self.layer_norm_eps, self.parallel = layer_norm_eps, parallel
        super().__init__(c)
        # Dynamic RoPE runs past max_position_embeddings (LlamaDecoder reads it from c.rope).

    def make_norm(self, dim: int) -> nn.Module:
        return nn.LayerNorm(dim, eps=self.layer_norm_eps)

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        return MLP(c.hidden_size, c.intermediate_size, c.hidden_act, bias=True)

    def make_block(self, layer: int) -> nn.Module:
        hidden = self.config.hidden_size
        attn, attn_norm = self.make_attention(layer), self.make_norm(hidden)
        mlp, mlp_norm = self.make_mlp(layer), self.make_norm(hidden)
        if self.parallel:
            return ParallelBlock(attn, attn_norm, mlp, mlp_norm, order="mlp+attn+x")
        return PreNormBlock(attn, attn_norm, mlp, mlp_norm)


def build(config: dict[str, Any]) -> GPTNeoXDecoder:
    config = neox_rope_config(config)
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    if hidden % heads:
        raise ValueError(f"hidden_size={hidden} is not divisible by num_attention_heads={heads}")
    head_dim = hidden // heads
    if config.get("head_dim") is not None and config["head_dim"] != head_dim:
        # transformers' attention splits hidden/heads but its rotary frequencies read head_dim:
        # two head sizes in one layer (found by bench/fuzz_reliability.py: 0.78 off).
        raise ValueError(
            f"head_dim is {config['head_dim']!r}; GPT-NeoX heads are hidden_size/num_attention_heads = {head_dim}"
        )
    layers = int(config["num_hidden_layers"])
    bias = bool(config.get("attention_bias", True))
    c = LlamaConfig.from_dict(
        {**config, "num_key_value_heads": heads, "head_dim": head_dim},
        hidden_act=str(config.get("hidden_act", "gelu")),
        qkv_bias=bias,
        o_bias=bias,
        ropes=(rope_config(config, head_dim, partial_rotary=True),) * layers,
        windows=(None,) * layers,
    )
    eps = float(config.get("layer_norm_eps", 1e-5))
    return GPTNeoXDecoder(c, eps, parallel=bool(config.get("use_parallel_residual", True)))


RULES = (
    (r"embed_in\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"layers\.(\d+)\.post_attention_layernorm\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"layers\.(\d+)\.attention\.query_key_value\.(weight|bias)", r"blocks.\1.attn.qkv.\2"),  # split in convert()
    (r"layers\.(\d+)\.attention\.dense\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (r"layers\.(\d+)\.mlp\.dense_h_to_4h\.(weight|bias)", r"blocks.\1.mlp.fc_in.\2"),
    (r"layers\.(\d+)\.mlp\.dense_4h_to_h\.(weight|bias)", r"blocks.\1.mlp.fc_out.\2"),
    (r"final_layer_norm\.(weight|bias)", r"final_norm.\1"),
    # Dropped: embed_out (the LM head), attention.bias / masked_bias / rotary_emb.inv_freq buffers.
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """Split each head-interleaved ``query_key_value`` into q_proj, k_proj and v_proj."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config["hidden_size"]) // heads
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        if ".attn.qkv." in name:
            prefix, kind = name.split(".attn.qkv.")
            for role, part in zip("qkv", split_per_head(tensor, heads, head_dim), strict=True):
                out[f"{prefix}.attn.{role}_proj.{kind}"] = part
        else:
            out[name] = tensor
    return out
