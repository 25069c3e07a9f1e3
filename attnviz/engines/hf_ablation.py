"""Where transformers' models take Concat(head_1, ..., head_H): the output projection W^O
of each attention layer, for ``--engine hf`` ablation by forward pre-hooks (``ablating``;
the hf engine's ``output_projections`` and ``final_hidden``).

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

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedArchitectureError

if TYPE_CHECKING:
    from ..nn.attention import Ablation

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


def output_projections(
    model: Any, part: str, num_layers: int, attention_layers: Sequence[int] | None = None
) -> list[Any]:
    """Per layer 0..num_layers-1 of ``part``: the module whose input is Concat(heads);
    None for the layers of a hybrid that have no attention (``attention_layers``: those
    that do; None = every layer).

    Raises:
        UnsupportedArchitectureError: this model's layout is not in PATTERNS.
    """
    modules = dict(model.named_modules())
    if part == "encoder" and _ALBERT in modules and getattr(model.config, "num_hidden_groups", 1) == 1:
        return [modules[_ALBERT]] * num_layers
    wanted = list(range(num_layers)) if attention_layers is None else sorted(attention_layers)
    for pattern in PATTERNS[part]:
        found: dict[int, Any] = {}
        for name, module in modules.items():
            match = re.fullmatch(pattern, name)
            if match:
                found[int(match.group(1))] = module
        if sorted(found) == wanted:
            return [found.get(layer) for layer in range(num_layers)]
    # One stack's attention is "self-attention"; "encoder" only where there is a decoder.
    what = f"{part} attention" if getattr(model.config, "is_encoder_decoder", False) else "self-attention"
    raise UnsupportedArchitectureError(
        f"the hf engine cannot find the output projections (W^O) of {type(model).__name__}'s {what} "
        "to ablate its heads",
        model_type=str(getattr(model.config, "model_type", "?")),
    )


@contextlib.contextmanager
def ablating(projections: Sequence[Any], layer: int, ablation: Ablation, num_heads: int) -> Iterator[None]:
    """Inside the block, layer ``layer``'s call of its W^O (``projections[layer]``) takes
    Concat(heads) (B, S, H·D) with batch element b's slice of head ``ablation.heads[b]``
    replaced by zero, or by ``ablation.fill[head]`` (mean-ablation)."""
    from ..nn.attention import remove_heads_

    def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        (concat, *rest) = args
        b, length, width = concat.shape  # (B, S, H·D)
        view = concat.clone().view(b, length, num_heads, width // num_heads)  # (B, S, H, D)
        return (remove_heads_(view, ablation).view(b, length, width), *rest)

    handle = _hook_at(projections, layer, hook)
    try:
        yield
    finally:
        handle.remove()


def _hook_at(modules: Sequence[Any], layer: int, hook: Callable[..., Any]) -> Any:
    """Register ``hook`` so it runs on layer ``layer``'s call of its module only (a module
    shared by several layers, ALBERT's, is called once per layer, in order)."""
    module = modules[layer]
    wanted = sum(1 for m in modules[:layer] if m is module)
    count = 0

    def once(mod: Any, args: tuple[Any, ...]) -> Any:
        nonlocal count
        count += 1
        return hook(mod, args) if count - 1 == wanted else None

    return module.register_forward_pre_hook(once)
