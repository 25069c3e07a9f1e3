"""ALBERT: BERT's post-LayerNorm block, with two parameter savings.

* Factorised embeddings: tokens are embedded ``embedding_size`` wide (e.g. 128)
  and projected up to ``hidden_size`` by ``embedding_hidden_mapping_in``.
* Cross-layer sharing: the checkpoint holds ``num_hidden_groups`` blocks (usually
  one) and every layer runs the block of its group. We keep the shared weights
  once, as the checkpoint does, and pick the block per layer in ``block_index``.
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedArchitectureError
from .bert import RULES as BERT_RULES
from .bert import BertConfig, BertEncoder
from .fields import whole

MODEL_TYPES = ("albert",)
PREFIXES = ("albert.",)

_LAYER = r"encoder\.albert_layer_groups\.(\d+)\.albert_layers\.0\."


class AlbertEncoder(BertEncoder):
    def __init__(self, c: BertConfig, num_groups: int) -> None:
        super().__init__(c, project=True, num_blocks=num_groups)
        self.num_groups = num_groups

    def block_index(self, layer: int) -> int:
        # transformers' own formula (float division), so uneven groupings agree too.
        return int(layer / (self.num_layers / self.num_groups))


def build(config: dict[str, Any]) -> AlbertEncoder:
    inner = whole(config, "inner_group_num", 1)
    if inner != 1:
        # Several distinct layers per group would make a "layer" run several attentions.
        raise UnsupportedArchitectureError(
            f"ALBERT with inner_group_num={inner} is not implemented by the own engine (only 1)"
        )
    groups = whole(config, "num_hidden_groups", 1)
    layers = int(config.get("num_hidden_layers", 12))
    if not 1 <= groups <= layers:
        raise ValueError(f"num_hidden_groups={groups} must be between 1 and num_hidden_layers={layers}")
    # transformers' AlbertConfig defaults, for configs that leave them out.
    c = BertConfig.from_dict({"embedding_size": 128, "hidden_act": "gelu_new", **config})
    return AlbertEncoder(c, groups)


RULES = (
    *BERT_RULES[:4],  # the embeddings are named as in BERT
    (r"encoder\.embedding_hidden_mapping_in\.(\w+)", r"project.\1"),
    (_LAYER + r"attention\.query\.(\w+)", r"blocks.\1.attn.q_proj.\2"),
    (_LAYER + r"attention\.key\.(\w+)", r"blocks.\1.attn.k_proj.\2"),
    (_LAYER + r"attention\.value\.(\w+)", r"blocks.\1.attn.v_proj.\2"),
    (_LAYER + r"attention\.dense\.(\w+)", r"blocks.\1.attn.o_proj.\2"),
    (_LAYER + r"attention\.LayerNorm\.(\w+)", r"blocks.\1.attn_norm.\2"),
    (_LAYER + r"ffn\.(\w+)", r"blocks.\1.ffn_in.\2"),
    (_LAYER + r"ffn_output\.(\w+)", r"blocks.\1.ffn_out.\2"),
    (_LAYER + r"full_layer_layer_norm\.(\w+)", r"blocks.\1.ffn_norm.\2"),
)
