"""OLMo 3: OLMo 2 with sliding-window layers, each layer type with rotary settings of its own.

Deltas from olmo2.py:

    window   the ``sliding_attention`` layers of ``layer_types`` see their last
             ``sliding_window`` tokens (by default three of every four layers; every
             fourth is ``full_attention``)
    RoPE     ``rope_parameters`` per layer type (``sliding_attention``, ``full_attention``),
             as Gemma 3: each layer rotates with its type's θ and scaling, cos/sin in float32

Everything else as OLMo 2: the norms after each sub-layer, an RMSNorm over all heads'
q and over all heads' k (H·D and G·D wide), ``attention_bias`` on q/k/v/o. torch only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import UnsupportedArchitectureError
from . import olmo2
from .fields import given, sequence, whole
from .llama import LlamaConfig, _windows_of
from .olmo2 import Olmo2Decoder
from .rope import rope_config

MODEL_TYPES = ("olmo3",)
PREFIXES = olmo2.PREFIXES
RULES = olmo2.RULES


DEFAULT_THETA = 500_000.0  # Olmo3Config.default_theta


def olmo3_rope_parameters(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The rope parameters per layer type, as transformers' ``Olmo3Config`` fills them in:
    the nested ``rope_parameters`` it writes; from an older config, ``rope_scaling`` and
    ``rope_theta`` for the full layers and the default θ for the sliding ones (transformers
    takes the one ``rope_theta`` for the full layers only)."""
    saved = config.get("rope_parameters")
    if isinstance(saved, Mapping) and saved and not all(isinstance(v, Mapping) for v in saved.values()):
        raise UnsupportedArchitectureError(
            "rope_parameters that are not given per layer type are not implemented for 'olmo3' by the own engine",
            setting="rope_parameters",
        )
    nested = {k: dict(v) for k, v in saved.items()} if isinstance(saved, Mapping) else {}
    # An entry absent or empty ({}) is plain RoPE.
    full = nested["full_attention"] if nested.get("full_attention") else {"rope_type": "default"}
    sliding = nested["sliding_attention"] if nested.get("sliding_attention") else {"rope_type": "default"}
    if isinstance(config.get("rope_scaling"), Mapping):
        full.update(config["rope_scaling"])
    full.setdefault("rope_theta", given(config, "rope_theta", DEFAULT_THETA))
    sliding.setdefault("rope_theta", DEFAULT_THETA)
    return {"full_attention": full, "sliding_attention": sliding}


def build(config: dict[str, Any]) -> Olmo2Decoder:
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    head_dim = whole(config, "head_dim", int(config["hidden_size"]) // heads)
    window = config.get("sliding_window")
    types = sequence(
        config, "layer_types", ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
    )
    windows = _windows_of(types, window, "olmo3", layers)
    if window is None and "sliding_attention" in types:
        raise ValueError("sliding_attention layers need a sliding_window")
    per_type = {**config, "rope_parameters": olmo3_rope_parameters(config)}
    ropes = tuple(rope_config(per_type, head_dim, layer_type=kind) for kind in types)
    bias = bool(config.get("attention_bias", False))
    return Olmo2Decoder(
        LlamaConfig.from_dict(config, windows=windows, ropes=ropes, qkv_bias=bias, o_bias=bias, mlp_bias=False)
    )
