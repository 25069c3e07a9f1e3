"""Starcoder2: the Llama stack with LayerNorms, a plain GELU MLP and biases throughout.

Deltas from llama.py:

    Norm     LayerNorm with weight and bias (``norm_epsilon``), not RMSNorm
    MLP(x)   = W_proj · act(W_fc · x + b_fc) + b_proj    (``hidden_act``, GELU-tanh), not SwiGLU
    biases   ``use_bias`` on q/k/v/o and on the MLP
    window   ``sliding_window`` on every layer when set (None: full causal attention)

torch only.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .base import activation
from .fields import number, text
from .llama import LlamaConfig, LlamaDecoder

MODEL_TYPES = ("starcoder2",)
PREFIXES = ("model.",)


class GeluMLP(nn.Module):
    def __init__(self, hidden: int, inner: int, act: str, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, inner, bias=bias)
        self.proj = nn.Linear(inner, hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class Starcoder2Decoder(LlamaDecoder):
    def make_norm(self, dim: int) -> nn.Module:
        return nn.LayerNorm(dim, eps=self.config.rms_norm_eps)

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        return GeluMLP(c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias)


def build(config: dict[str, Any]) -> Starcoder2Decoder:
    bias = bool(config.get("use_bias", True))
    layers = int(config["num_hidden_layers"])
    window = config.get("sliding_window")
    return Starcoder2Decoder(
        LlamaConfig.from_dict(
            config,
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            rms_norm_eps=number(config, "norm_epsilon", 1e-5, above=0.0),  # the LayerNorms' eps
            hidden_act=text(config, "hidden_act", "gelu_pytorch_tanh"),
            windows=(None if window is None else int(window),) * layers,
        )
    )


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (r"layers\.(\d+)\.post_attention_layernorm\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"layers\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"blocks.\1.mlp.fc.\2"),
    (r"layers\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"blocks.\1.mlp.proj.\2"),
    (r"norm\.(weight|bias)", r"final_norm.\1"),
)
