"""Where transformers' models take Concat(head_1, ..., head_H): the output projection W^O
of each attention layer, for ``--engine hf`` ablation by forward pre-hooks.

Found by name in the base model (``AutoModel``), one pattern per layout:

    BERT, RoBERTa, ELECTRA, DeBERTa   encoder.layer.N.attention.output.dense
    DistilBERT                        transformer.layer.N.attention.out_lin
    ALBERT                            encoder.albert_layer_groups.0.albert_layers.0.attention.dense
                                      (one shared layer: called once per layer, in order)
    GPT-2                             h.N.attn.c_proj
    Llama-like decoders               layers.N.self_attn.o_proj
    ModernBERT                        layers.N.attn.Wo
    BART, mBART                       (encoder|decoder).layers.N.self_attn.out_proj,
                                      decoder.layers.N.encoder_attn.out_proj
    T5                                (encoder|decoder).block.N.layer.0.SelfAttention.o,
                                      decoder.block.N.layer.1.EncDecAttention.o

torch only (the model is given).
"""

from __future__ import annotations

import re
from typing import Any

from .errors import UnsupportedArchitectureError

_LAYER = r"(\d+)"
PATTERNS: dict[str, tuple[str, ...]] = {
    "encoder": (
        rf"(?:encoder\.)?layer\.{_LAYER}\.attention\.output\.dense",
        rf"transformer\.layer\.{_LAYER}\.attention\.out_lin",
        rf"h\.{_LAYER}\.attn\.c_proj",
        rf"layers\.{_LAYER}\.self_attn\.o_proj",
        rf"layers\.{_LAYER}\.attn\.Wo",
        rf"encoder\.layers\.{_LAYER}\.self_attn\.out_proj",
        rf"encoder\.block\.{_LAYER}\.layer\.0\.SelfAttention\.o",
    ),
    "decoder": (
        rf"decoder\.layers\.{_LAYER}\.self_attn\.out_proj",
        rf"decoder\.block\.{_LAYER}\.layer\.0\.SelfAttention\.o",
    ),
    "cross": (
        rf"decoder\.layers\.{_LAYER}\.encoder_attn\.out_proj",
        rf"decoder\.block\.{_LAYER}\.layer\.1\.EncDecAttention\.o",
    ),
}
_ALBERT = "encoder.albert_layer_groups.0.albert_layers.0.attention.dense"


def output_projections(model: Any, part: str, num_layers: int) -> list[Any]:
    """Per layer 0..num_layers-1 of ``part``: the module whose input is Concat(heads).

    Raises:
        UnsupportedArchitectureError: this model's layout is not in PATTERNS.
    """
    modules = dict(model.named_modules())
    if part == "encoder" and _ALBERT in modules and getattr(model.config, "num_hidden_groups", 1) == 1:
        return [modules[_ALBERT]] * num_layers
    for pattern in PATTERNS[part]:
        found: dict[int, Any] = {}
        for name, module in modules.items():
            match = re.fullmatch(pattern, name)
            if match:
                found[int(match.group(1))] = module
        if sorted(found) == list(range(num_layers)):
            return [found[layer] for layer in range(num_layers)]
    raise UnsupportedArchitectureError(
        f"the hf engine cannot find the output projections of {type(model).__name__}'s {part} attention "
        "to ablate its heads",
        model_type=str(getattr(model.config, "model_type", "?")),
    )
