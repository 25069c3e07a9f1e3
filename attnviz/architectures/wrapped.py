"""Vision-language wrappers read as their language model: Gemma 3 (``gemma3``: Gemma 3 4B,
12B and 27B as published), Gemma 3n (``gemma3n``: E2B and E4B as published), Gemma 4
(``gemma4``), Mistral 3 (``mistral3``: Mistral Small 3.1/3.2, Ministral 3, Mistral Small 4),
Qwen3.5 (``qwen3_5``, ``qwen3_5_moe``) and LFM2-VL (``lfm2_vl``), on text alone.

On text, such a model is its language model: transformers embeds the ids with the language
model's own table, adds no image features (there are no pixels), builds the language
model's own masks and runs it. So the own engine builds the family of the wrapper's
``text_config`` (gemma3_text; gemma3n_text; gemma4_text; mistral, ministral3 or mistral4;
qwen3_5_text or qwen3_5_moe_text; lfm2) and fills it with the weights under the language model's prefix:

    language_model.model.*      as transformers 5 saves Gemma 3 and Mistral 3 (and 4.x did)
    model.language_model.*      as it holds them in memory, and saves Qwen3.5 and LFM2-VL

Gemma 3n (``gemma3n``) also embeds the ids past its text table, its image and audio soft
tokens, with the wrapper's embedders (``model.embed_vision``, ``model.embed_audio``), which
gemma3n.py reads (``build_wrapped``, ``WRAPPER_RULES``).

(Qwen3.5's multimodal RoPE gives each rotary section the token's position on one axis of
time, height and width; text has the same position on all three, so it is plain RoPE.)

The vision tower and the projector are not read. No images ever reach the model: attnviz
reads text, and the wrapped model's views are the language model's layers and heads.

torch only.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from torch import Tensor, nn

from ..errors import ModelLoadError, UnsupportedArchitectureError
from ..io.models import WRAPPED_TEXT_TYPES, text_config
from .base import rename

MODEL_TYPES = tuple(WRAPPED_TEXT_TYPES)
PREFIXES = ()
RULES = ((r"(.+)", r"\1"),)  # every name kept here; ``convert`` picks the language model's

# Where the language model's weights sit in a wrapper's checkpoint, saved or in memory.
LANGUAGE_MODEL = ("language_model.model.", "model.language_model.", "language_model.")


def inner(config: dict[str, Any]) -> tuple[dict[str, Any], ModuleType]:
    """The wrapped language model's config and family module. Raises
    UnsupportedArchitectureError when the own engine has no stack for it."""
    from . import registry

    text = text_config(config)
    if text is config:
        raise ModelLoadError(
            f"config.json: a {config.get('model_type')!r} config needs a text_config object",
            hint="the config is invalid",
        )
    kind = text.get("model_type")
    found = registry().get(kind) if isinstance(kind, str) else None
    if found is None or kind in MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"the own engine does not implement {kind!r}, the language model of this "
            f"{config.get('model_type')!r} checkpoint",
            model_type=str(kind),
        )
    return text, found


def build(config: dict[str, Any]) -> nn.Module:
    text, module = inner(config)
    # A family that reads more of the wrapper than its text_config (Gemma 3n: the embedders of
    # the ids past the text table) builds from both.
    wrapped = getattr(module, "build_wrapped", None)
    built: nn.Module = wrapped(text, config) if wrapped is not None else module.build(text)
    return built


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """The language model's tensors, named as its own family names them."""
    text, module = inner(config)
    own: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        prefix = next((p for p in LANGUAGE_MODEL if name.startswith(p)), None)
        if prefix is not None:
            own[name[len(prefix) :]] = tensor
    own = rename(own, module.RULES, module.PREFIXES)
    own.update(rename(tensors, getattr(module, "WRAPPER_RULES", ())))  # the wrapper's own, where read
    converted: dict[str, Tensor] = module.convert(own, text) if hasattr(module, "convert") else own
    return converted
