"""Which engine shows which model type, and why the others are refused: one place that
the refusals, their hints and the families page (``attnviz check --list``) all read.

    own   our own stack (``attnviz.architectures``: each family module's MODEL_TYPES);
          the hf engine runs it too
    hf    transformers' own eager heads only (the hf engine)
    none  neither engine: the model reads no text (audio, images, video, time series),
          or its attention has no per-token weights to show (``REFUSED``)

What a model type reads is transformers' own answer, the ``main_input_name`` of the
class ``AutoModel`` builds for it, never a hand-kept list; only the block-sparse and
state-returning attentions are named here, each with its reason.

Nothing heavy at import; transformers (and, for the own engine's table, torch) are
imported inside the functions that read them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Model types whose attention returns no (query × key) weights over the whole text, with why.
# Both engines refuse them, before any model work (the hf engine's causality probe would
# otherwise crash on the shapes they return).
REFUSED: dict[str, str] = {
    "longt5": (
        "LongT5's local and transient-global attention scores each block of the text against its "
        "neighbouring blocks, so transformers returns per-block weights, not one row per token over the text"
    ),
    "minimax": (
        "MiniMax's lightning-attention layers keep a running key-value state instead of softmax weights, "
        "and transformers returns that state where the weights belong"
    ),
}

REFUSED_SHORT: dict[str, str] = {
    "longt5": "block-local attention: per-block weights, not per token",
    "minimax": "lightning attention: a running state, not weights",
}

# What a main input name reads, for the refusal of models that read no text.
_MODALITY = {
    "pixel_values": "images",
    "pixel_values_videos": "video",
    "input_values": "audio waveforms",
    "input_features": "audio features",
    "audio_mel": "audio features",
    "past_values": "time series",
    "latents": "latent codes",
}

VERDICTS = ("own", "hf", "none")


@dataclass(frozen=True)
class Support:
    """Where one model type runs.

    Attributes:
        model_type: config.json's ``model_type``.
        verdict: "own" (both engines), "hf" (the hf engine only) or "none".
        why: for "hf", that the own engine has no stack for the type; for "none", in a few
            words, why neither engine shows it ("" for "own").
    """

    model_type: str
    verdict: str
    why: str


def refusal(model_type: str) -> str | None:
    """Why neither engine can show ``model_type``'s attention, in one sentence, or None
    when one can (or transformers does not know the type: then loading it says so)."""
    if model_type in REFUSED:
        return REFUSED[model_type]
    reads = _non_text_input(model_type)
    if reads is None:
        return None
    what = _MODALITY.get(reads, f"{reads!r}")
    return (
        f"{model_type!r} models read {what}, not text (transformers' {_class_name(model_type)} takes {reads}); "
        "attnviz shows the attention of text models"
    )


def _non_text_input(model_type: str) -> str | None:
    reads = main_input(model_type)
    return None if reads is None or reads == "input_ids" else reads


def short_reason(model_type: str) -> str:
    """A few words on why neither engine shows ``model_type`` (for the list)."""
    if model_type in REFUSED:
        return REFUSED_SHORT[model_type]
    reads = _non_text_input(model_type)
    return f"reads {_MODALITY.get(reads or '', repr(reads))} ({reads}), not text"


@functools.cache
def _base_classes() -> Mapping[str, Any]:
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return MODEL_MAPPING_NAMES


def _class_name(model_type: str) -> str | None:
    name = _base_classes().get(model_type)
    if isinstance(name, (tuple, list)):
        name = name[0] if name else None
    return str(name) if name else None


@functools.cache
def main_input(model_type: str) -> str | None:
    """The input transformers' base model of ``model_type`` reads ("input_ids",
    "pixel_values", "input_features", ...); None for a type it does not know."""
    import warnings

    name = _class_name(model_type)
    if name is None:
        return None
    import logging

    before = logging.root.manager.disable
    try:
        import transformers

        # Importing a modeling module may log (kernels' offline notes): not ours to print.
        logging.disable(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = getattr(transformers, name)
        return str(getattr(cls, "main_input_name", "input_ids"))
    except Exception:  # noqa: BLE001 - a class that cannot be imported here is judged when loaded
        return None
    finally:
        logging.disable(before)


def own_types() -> frozenset[str]:
    """The model types the own engine implements (imports torch)."""
    from ..architectures import registry

    return frozenset(registry())


def transformers_types() -> list[str]:
    """Every model type transformers' ``AutoModel`` builds, sorted."""
    return sorted(_base_classes())


def support(model_type: str, own: frozenset[str] | None = None) -> Support:
    """``model_type``'s verdict (``own``: the own engine's types, read when None)."""
    own = own_types() if own is None else own
    if model_type in own:
        return Support(model_type, "own", "")
    if refusal(model_type) is not None:
        return Support(model_type, "none", short_reason(model_type))
    return Support(model_type, "hf", HF_ONLY + (f": {NOT_YET[model_type]}" if model_type in NOT_YET else ""))


# Why a text model transformers builds is "hf" in the list.
HF_ONLY = "no own stack (yet)"

# Text models the own engine was held back from, with what it lacks (none at present).
NOT_YET: dict[str, str] = {}


def table() -> list[Support]:
    """Every model type transformers' ``AutoModel`` builds and every one the own engine
    implements, sorted by model type."""
    own = own_types()
    return [support(t, own) for t in sorted(set(transformers_types()) | own)]


def to_dict(rows: list[Support]) -> dict[str, Any]:
    """The list as a JSON document: counts per verdict, and one entry per model type."""
    counts = {verdict: sum(1 for r in rows if r.verdict == verdict) for verdict in VERDICTS}
    return {
        "counts": counts,
        "model_types": [{"model_type": r.model_type, "engines": ENGINES[r.verdict], "why": r.why} for r in rows],
    }


# The engines that show each verdict's model types.
ENGINES: dict[str, list[str]] = {"own": ["own", "hf"], "hf": ["hf"], "none": []}
