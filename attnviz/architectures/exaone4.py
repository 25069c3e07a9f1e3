"""EXAONE 4: OLMo 2's norms after each sub-layer, Qwen3's per-head q/k norms, and
rotary embeddings only on the sliding-window layers of a hybrid pattern.

Deltas from llama.py:

    block     x = x + Norm_post_attn(Attention(x));  x = x + Norm_post_mlp(MLP(x))
              (olmo2.py's PostNormBlock: no norm before either sub-layer)
    q/k norm  an RMSNorm over each head's D, one (D,) weight for all heads, before RoPE
              (qwen3.py)
    window    the ``sliding_attention`` layers of ``layer_types`` (by default all but every
              ``sliding_window_pattern``-th) see their last ``sliding_window`` tokens
    RoPE      with a ``sliding_window``: on the sliding layers alone, the global ones see
              no positions (NoPE); without one, on every layer
    biases    none

torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention, QKTransform
from . import llama
from .fields import sequence
from .llama import LlamaConfig, LlamaDecoder, _windows_of
from .olmo2 import PostNormBlock
from .qwen3 import QK_NORM_RULES, qk_norm_attention

MODEL_TYPES = ("exaone4",)
PREFIXES = llama.PREFIXES


@dataclass(frozen=True)
class Exaone4Config(LlamaConfig):
    rotary_layers: tuple[bool, ...] = ()  # per layer: whether q and k are rotated

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.rotary_layers) != self.num_hidden_layers:
            raise ValueError(f"{len(self.rotary_layers)} rotary flags for {self.num_hidden_layers} layers")


class Exaone4Decoder(LlamaDecoder):
    config: Exaone4Config

    def make_attention(self, layer: int) -> MultiHeadAttention:
        return qk_norm_attention(self.config)

    def make_block(self, layer: int) -> nn.Module:
        c = self.config
        return PostNormBlock(
            attn=self.make_attention(layer),
            post_attn_norm=self.make_norm(c.hidden_size),
            mlp=self.make_mlp(layer),
            post_mlp_norm=self.make_norm(c.hidden_size),
        )

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        rotated = super().qk_transforms(input_ids, x)
        return [qk if on else None for qk, on in zip(rotated, self.config.rotary_layers, strict=True)]


def build(config: dict[str, Any]) -> Exaone4Decoder:
    layers = int(config["num_hidden_layers"])
    window = config.get("sliding_window")
    pattern = config.get("sliding_window_pattern")
    period = 0 if window is None else int(pattern if isinstance(pattern, int) else 4)
    types = sequence(
        config,
        "layer_types",
        ["sliding_attention" if period and (i + 1) % period else "full_attention" for i in range(layers)],
    )
    if window is None and "sliding_attention" in types:
        # transformers rotates every layer then and masks none by a window: a config it never writes.
        raise ValueError("sliding_attention layers need a sliding_window")
    windows = _windows_of(types, window, "exaone4", layers)
    rotary = tuple(window is None or kind == "sliding_attention" for kind in types)
    base = LlamaConfig.from_dict(config, windows=windows, qkv_bias=False, o_bias=False, mlp_bias=False)
    return Exaone4Decoder(Exaone4Config(**vars(base), rotary_layers=rotary))


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight", r"blocks.\1.attn.\2_proj.weight"),
    *QK_NORM_RULES,
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.post_attn_norm.weight"),
    (r"layers\.(\d+)\.post_feedforward_layernorm\.weight", r"blocks.\1.post_mlp_norm.weight"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
    (r"norm\.weight", r"final_norm.weight"),
)
