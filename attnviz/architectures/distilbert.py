"""DistilBERT: BERT's post-LayerNorm blocks under other names, without token types.

Its config names things its own way (dim, n_layers, n_heads, hidden_dim,
activation) and fixes LayerNorm's eps at 1e-12. With ``sinusoidal_pos_embds`` the
position table is a fixed sinusoid, but it is still saved in the checkpoint as
``position_embeddings.weight``, so we read it like any learned table.
"""

from __future__ import annotations

from typing import Any

from .base import config_value
from .bert import BertConfig, BertEncoder

MODEL_TYPES = ("distilbert",)
PREFIXES = ("distilbert.",)


def build(config: dict[str, Any]) -> BertEncoder:
    c = BertConfig.from_dict(
        config,
        hidden_size=config_value(config, "dim", "hidden_size", default=768),
        num_hidden_layers=config_value(config, "n_layers", "num_hidden_layers", default=6),
        num_attention_heads=config_value(config, "n_heads", "num_attention_heads", default=12),
        intermediate_size=config_value(config, "hidden_dim", "intermediate_size", default=3072),
        hidden_act=config_value(config, "activation", "hidden_act", default="gelu"),
        type_vocab_size=0,
        layer_norm_eps=1e-12,  # hard-coded in transformers' DistilBERT, not in its config
    )
    return BertEncoder(c)


RULES = (
    (r"embeddings\.word_embeddings\.(\w+)", r"embed.tokens.\1"),
    (r"embeddings\.position_embeddings\.(\w+)", r"embed.positions.\1"),
    (r"embeddings\.LayerNorm\.(\w+)", r"embed.norm.\1"),
    (r"transformer\.layer\.(\d+)\.attention\.q_lin\.(\w+)", r"blocks.\1.attn.q_proj.\2"),
    (r"transformer\.layer\.(\d+)\.attention\.k_lin\.(\w+)", r"blocks.\1.attn.k_proj.\2"),
    (r"transformer\.layer\.(\d+)\.attention\.v_lin\.(\w+)", r"blocks.\1.attn.v_proj.\2"),
    (r"transformer\.layer\.(\d+)\.attention\.out_lin\.(\w+)", r"blocks.\1.attn.o_proj.\2"),
    (r"transformer\.layer\.(\d+)\.sa_layer_norm\.(\w+)", r"blocks.\1.attn_norm.\2"),
    (r"transformer\.layer\.(\d+)\.ffn\.lin1\.(\w+)", r"blocks.\1.ffn_in.\2"),
    (r"transformer\.layer\.(\d+)\.ffn\.lin2\.(\w+)", r"blocks.\1.ffn_out.\2"),
    (r"transformer\.layer\.(\d+)\.output_layer_norm\.(\w+)", r"blocks.\1.ffn_norm.\2"),
)
