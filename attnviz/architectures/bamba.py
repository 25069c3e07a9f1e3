"""Bamba (IBM, Princeton, UIUC): a hybrid of Mamba2 layers and a few Llama-like softmax
attention layers, each layer followed by a SwiGLU MLP.

    attention layers  ``attn_layer_indices`` (transformers' ``layers_block_type``
                      "full_attention"): Llama's grouped-query attention, biases from
                      ``attention_bias``, RoPE on the first half of each head's dims
                      (transformers fixes ``partial_rotary_factor`` at 0.5 unless
                      ``rope_parameters`` names another)
    other layers      a Mamba2 mixer (mamba2.py): ``mamba_n_heads`` heads of
                      ``mamba_d_head`` ("auto": ``mamba_expand``·E / heads),
                      ``mamba_n_groups`` groups of B and C, a state of ``mamba_d_state``,
                      a convolution of ``mamba_d_conv``, the scan in chunks of
                      ``mamba_chunk_size``, Δ clamped to ``time_step_limit``
    every layer       pre-RMSNorm (``input_layernorm``, ``pre_ff_layernorm``), a SwiGLU
                      MLP (``feed_forward``), a final RMSNorm (``final_layernorm``)

The softmax layers' heads are plain heads: their weights, value norms, explain and
ablation are as any Llama layer's. Views list them alone, by their model layer numbers
(hybrid.py). torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from .fields import given, number, sequence, whole
from .hybrid import HybridDecoder, MixerBlock
from .llama import LlamaConfig
from .mamba2 import Mamba2Mixer
from .rope import rope_config

MODEL_TYPES = ("bamba",)
PREFIXES = ("model.",)


@dataclass(frozen=True)
class BambaConfig(LlamaConfig):
    attention_indices: tuple[int, ...] = ()  # the softmax layers; the others Mamba2
    mamba_heads: int = 1
    mamba_head_dim: int = 1
    mamba_groups: int = 1
    mamba_state: int = 1
    mamba_kernel: int = 4
    mamba_chunk: int = 256
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    time_step_limit: tuple[float, float] = (0.0, math.inf)

    def __post_init__(self) -> None:
        super().__post_init__()
        outside = [i for i in self.attention_indices if not 0 <= i < self.num_hidden_layers]
        if outside:
            raise ValueError(f"attn_layer_indices {outside} are not layers of {self.num_hidden_layers}")
        if not self.attention_indices:
            raise ValueError("attn_layer_indices names no layer: nothing has attention weights to show")
        if self.mamba_heads % self.mamba_groups:
            raise ValueError(f"mamba_n_groups={self.mamba_groups} does not divide mamba_n_heads={self.mamba_heads}")
        low, high = self.time_step_limit
        if not 0.0 <= low <= high:
            raise ValueError(f"time_step_limit {list(self.time_step_limit)} must be 0 <= low <= high")


class BambaDecoder(HybridDecoder):
    config: BambaConfig
    mixer = "Mamba2"

    def softmax_layers(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.config.attention_indices)))

    def make_block(self, layer: int) -> nn.Module:
        if layer in self.config.attention_indices:
            return super().make_block(layer)  # Llama's pre-norm attention block
        e = self.config.hidden_size
        return MixerBlock(self.make_mixer(), self.make_norm(e), self.make_mlp(layer), self.make_norm(e))

    def make_mixer(self) -> Mamba2Mixer:
        """A Mamba2 layer's mixer, from the config's mamba_* fields (Granite-4.0-H's too)."""
        c = self.config
        return Mamba2Mixer(
            c.hidden_size,
            c.mamba_heads,
            c.mamba_head_dim,
            c.mamba_groups,
            c.mamba_state,
            c.mamba_kernel,
            c.mamba_chunk,
            act=c.hidden_act,
            eps=c.rms_norm_eps,
            conv_bias=c.mamba_conv_bias,
            proj_bias=c.mamba_proj_bias,
            limit=c.time_step_limit,
        )


# transformers 5 saves a float JSON cannot hold as {"__float__": "Infinity"} (its
# ``_encode_special_floats``); an older save as the bare literal Infinity, which Python reads.
_SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf}


def _limit(config: dict[str, Any]) -> tuple[float, float]:
    """``time_step_limit`` [low, high], the bounds of Δ; high may be Infinity (the default)."""
    value = given(config, "time_step_limit", [0.0, math.inf])
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"time_step_limit is {value!r}; it must be a pair [low, high]")
    bounds = []
    for v in value:
        if isinstance(v, dict) and set(v) == {"__float__"}:
            v = _SPECIAL_FLOATS.get(v["__float__"], v)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise ValueError(f"time_step_limit is {value!r}; it must be two numbers")
        bounds.append(float(v))
    return bounds[0], bounds[1]


def mamba_fields(config: dict[str, Any], hidden: int) -> dict[str, Any]:
    """``BambaConfig``'s Mamba2 fields from config.json, absent keys read as transformers'
    BambaConfig (and GraniteMoeHybridConfig) default them."""
    expand = whole(config, "mamba_expand", 2)
    heads = whole(config, "mamba_n_heads", 128)
    auto = config.get("mamba_d_head", "auto") in ("auto", None)
    head_dim = expand * hidden // heads if auto else whole(config, "mamba_d_head", 1)
    if head_dim * heads != expand * hidden:
        raise ValueError(
            f"mamba_n_heads {heads} × mamba_d_head {head_dim} is not mamba_expand·hidden_size {expand * hidden}"
        )
    return {
        "mamba_heads": heads,
        "mamba_head_dim": head_dim,
        "mamba_groups": whole(config, "mamba_n_groups", 1),
        "mamba_state": whole(config, "mamba_d_state", 256),
        "mamba_kernel": whole(config, "mamba_d_conv", 4),
        "mamba_chunk": whole(config, "mamba_chunk_size", 256),
        "mamba_conv_bias": bool(given(config, "mamba_conv_bias", True)),
        "mamba_proj_bias": bool(given(config, "mamba_proj_bias", False)),
        "time_step_limit": _limit(config),
    }


def build(config: dict[str, Any]) -> BambaDecoder:
    # Absent keys read as transformers' BambaConfig defaults them (0 and [] are values).
    layers = whole(config, "num_hidden_layers", 32)
    hidden = whole(config, "hidden_size", 4096)
    heads = whole(config, "num_attention_heads", 32)
    kv_heads = config.get("num_key_value_heads", 8)
    head_dim = whole(config, "head_dim", hidden // heads)
    # transformers fixes the rotary fraction at 0.5 (its "hardcode for BC"): a top-level
    # partial_rotary_factor is overridden, one inside rope_parameters is kept.
    params = {**config, "partial_rotary_factor": 0.5}
    rope = rope_config(params, head_dim, partial_rotary=True)
    base = LlamaConfig.from_dict(
        {**config, "num_key_value_heads": heads if kv_heads is None else kv_heads},
        num_hidden_layers=layers,
        hidden_size=hidden,
        head_dim=head_dim,
        rms_norm_eps=number(config, "rms_norm_eps", 1e-5, above=0.0),
        max_position_embeddings=whole(config, "max_position_embeddings", 262144),
        ropes=(rope,) * layers,
        windows=(None,) * layers,
    )
    indices = tuple(int(i) for i in sequence(config, "attn_layer_indices", []))
    return BambaDecoder(BambaConfig(**vars(base), attention_indices=indices, **mamba_fields(config, hidden)))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.pre_ff_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    # The Mamba2 mixer's parameters keep their names (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj).
    (r"layers\.(\d+)\.mamba\.([\w.]+)", r"blocks.\1.mixer.\2"),
    (r"layers\.(\d+)\.feed_forward\.(gate|up|down)_proj\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"final_layernorm\.weight", r"final_norm.weight"),
)
