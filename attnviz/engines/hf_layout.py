"""Which of a transformers model's modules is which, for the hf engine's taps
(hf_taps.py): W^O per layer (the module whose input is Concat(heads)), and per role the
attention module, the layer, the MLP and a value projection, read from the module names
of the base model, one pattern per layout (``W_O``, ``PATTERNS``); ALBERT's shared groups
by its config. A hybrid's layers without attention have none (None in the lists). No
hook and no torch here: names and modules only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import UnsupportedArchitectureError

_N = r"(\d+)"
# Per part: W^O, the module whose input is Concat(heads) (the taps z, out, attn_out).
W_O: dict[str, tuple[str, ...]] = {
    "encoder": (
        rf"(?:encoder\.)?layer\.{_N}\.attention\.output\.dense",
        rf"transformer\.layer\.{_N}\.attention\.out_lin",
        rf"h\.{_N}\.attn\.c_proj",
        rf"layers\.{_N}\.self_attn\.o_proj",
        rf"layers\.{_N}\.attn\.Wo",
        rf"layers\.{_N}\.attention\.dense",  # GPT-NeoX
        rf"encoder\.layers\.{_N}\.self_attn\.out_proj",
        rf"encoder\.block\.{_N}\.layer\.0\.SelfAttention\.o",
    ),
    "decoder": (
        rf"decoder\.layers\.{_N}\.self_attn\.out_proj",
        rf"decoder\.block\.{_N}\.layer\.0\.SelfAttention\.o",
    ),
    "cross": (
        rf"decoder\.layers\.{_N}\.encoder_attn\.out_proj",
        rf"decoder\.block\.{_N}\.layer\.1\.EncDecAttention\.o",
    ),
}
_ALBERT = "encoder.albert_layer_groups.{group}.albert_layers.0.{what}"


def _albert(model: Any, modules: dict[str, Any], part: str, what: str, num_layers: int) -> list[Any] | None:
    """ALBERT's shared blocks, per layer 0..num_layers-1: layer n runs the one layer of
    group ⌊n / (num_layers / groups)⌋ (transformers' ``AlbertTransformer``); None for another
    model (or an ALBERT whose groups hold several layers, which the patterns then refuse)."""
    config = model.config
    groups = int(getattr(config, "num_hidden_groups", 1) or 1)
    if part != "encoder" or _ALBERT.format(group=0, what=what) not in modules:
        return None
    if getattr(config, "inner_group_num", 1) != 1:
        return None
    # transformers' own formula (a float division), so uneven groupings agree too
    return [modules[_ALBERT.format(group=int(n / (num_layers / groups)), what=what)] for n in range(num_layers)]


def output_projections(
    model: Any, part: str, num_layers: int, attention_layers: Sequence[int] | None = None
) -> list[Any]:
    """Per layer 0..num_layers-1 of ``part``: the module whose input is Concat(heads);
    None for the layers of a hybrid that have no attention (``attention_layers``: those
    that do; None = every layer).

    Raises:
        UnsupportedArchitectureError: this model's layout is not in W_O.
    """
    modules = dict(model.named_modules())
    albert = _albert(model, modules, part, "attention.dense", num_layers)
    if albert is not None:
        return albert
    found = _by_pattern(modules, W_O[part], num_layers, attention_layers)
    if found is not None:
        return found
    # One stack's attention is "self-attention"; "encoder" only where there is a decoder.
    what = f"{part} attention" if getattr(model.config, "is_encoder_decoder", False) else "self-attention"
    raise UnsupportedArchitectureError(
        f"the hf engine cannot find the output projections (W^O) of {type(model).__name__}'s {what} to tap its heads",
        model_type=str(getattr(model.config, "model_type", "?")),
    )


# Per part and role: the module names' patterns, the layer number in the group.
PATTERNS: dict[tuple[str, str], tuple[str, ...]] = {
    # the module that calls the attention function
    ("encoder", "attention"): (
        rf"(?:encoder\.)?layer\.{_N}\.attention\.self",
        rf"transformer\.layer\.{_N}\.attention",
        rf"h\.{_N}\.attn",
        rf"layers\.{_N}\.self_attn",
        rf"layers\.{_N}\.attn",
        rf"layers\.{_N}\.attention",  # GPT-NeoX
        rf"encoder\.layers\.{_N}\.self_attn",
        rf"encoder\.block\.{_N}\.layer\.0\.SelfAttention",
    ),
    ("decoder", "attention"): (
        rf"decoder\.layers\.{_N}\.self_attn",
        rf"decoder\.block\.{_N}\.layer\.0\.SelfAttention",
    ),
    ("cross", "attention"): (
        rf"decoder\.layers\.{_N}\.encoder_attn",
        rf"decoder\.block\.{_N}\.layer\.1\.EncDecAttention",
    ),
    # one layer of the stack
    ("encoder", "layer"): (
        rf"(?:encoder\.)?layer\.{_N}",
        rf"h\.{_N}",
        rf"layers\.{_N}",
        rf"encoder\.layers\.{_N}",
        rf"encoder\.block\.{_N}",
    ),
    ("decoder", "layer"): (rf"decoder\.layers\.{_N}", rf"decoder\.block\.{_N}"),
    # the MLP's output, before any dropout, norm or residual
    ("encoder", "mlp"): (
        rf"(?:encoder\.)?layer\.{_N}\.output\.dense",
        rf"h\.{_N}\.mlp",
        rf"layers\.{_N}\.mlp",
        rf"encoder\.layers\.{_N}\.fc2",
        rf"encoder\.block\.{_N}\.layer\.1\.DenseReluDense",
    ),
    ("decoder", "mlp"): (rf"decoder\.layers\.{_N}\.fc2", rf"decoder\.block\.{_N}\.layer\.2\.DenseReluDense"),
    # the value projection, for the v tap of a family whose attention does not go through
    # transformers' attention interface (DeBERTa): its output split into heads is v
    ("encoder", "value"): (rf"(?:encoder\.)?layer\.{_N}\.attention\.self\.value_proj",),
}
# Families whose attention output is normed or scaled before it joins the stream (their
# attn_out is not W^O's output) or whose blocks these patterns misread: attn_out and
# mlp_out are not mapped for them (the own engine taps them).
OTHER_SUBLAYERS = frozenset(
    {
        "gemma2",
        "gemma3_text",
        "gemma3",
        "gemma3n_text",
        "gemma3n",
        "gemma4_text",
        "gemma4",
        "olmo2",
        "granite",
        "granitemoe",
        "bloom",
    }
)
# Families whose layers pass on several residual streams stacked first (Gemma 3n's AltUp:
# (A, B, Q, E)): their resid_pre and resid_post are seen as (B, Q, A, E), as the own engine
# holds them, so that positions (and a batch of copies) are where every tap has them.
STREAMS_FIRST = frozenset({"gemma3n_text", "gemma3n"})


def role_modules(
    model: Any, part: str, role: str, num_layers: int, present: Sequence[int] | None = None
) -> list[Any] | None:
    """Per layer 0..num_layers-1 of ``part``: the ``role`` module (None in a layer not in
    ``present``, a hybrid's layer without attention); None when no pattern fits."""
    modules = dict(model.named_modules())
    if role == "attention":
        albert = _albert(model, modules, part, "attention", num_layers)
        if albert is not None:
            return albert
    return _by_pattern(modules, PATTERNS.get((part, role), ()), num_layers, present)


def _by_pattern(
    modules: dict[str, Any], patterns: Sequence[str], num_layers: int, present: Sequence[int] | None
) -> list[Any] | None:
    """The first pattern whose matches number exactly the layers ``present`` (None: every
    layer), as a list over layers 0..num_layers-1 (None where absent); None if none fits."""
    wanted = list(range(num_layers)) if present is None else sorted(present)
    for pattern in patterns:
        found: dict[int, Any] = {}
        for name, module in modules.items():
            match = re.fullmatch(pattern, name)
            if match:
                found[int(match.group(1))] = module
        if sorted(found) == wanted:
            return [found.get(layer) for layer in range(num_layers)]
    return None
