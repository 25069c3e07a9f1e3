"""The tiny Gemma 3n wrapper checkpoint (``gemma3n``): tests/builders/families_2026.py's
``gemma3n_text`` language model inside transformers' multimodal wrapper."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import Spec, _config
from .families_2026 import GEMMA3N_TEXT, save_2026

# The Gemma 3n wrapper (``gemma3n``, as Gemma 3n E2B/E4B are published) on its tiny language
# model: its image soft tokens are ids 90-94, its audio ones 95-100 (the top of the text's 101),
# each embedded by the wrapper's own embedder. transformers builds the MobileNet vision tower
# only with timm, which is no dependency: ``save_gemma3n`` and the references build the wrapper
# with ``stub_vision_tower`` (an empty module; text never reaches the tower, and attnviz reads
# no tower). The audio tower is transformers' own, one tiny conformer layer.
GEMMA3N_VISION = dict(hidden_size=12, vocab_size=5, vocab_offset=90)
GEMMA3N_AUDIO = dict(
    hidden_size=16,
    vocab_size=6,
    vocab_offset=95,
    input_feat_size=8,
    conf_num_attention_heads=2,
    conf_num_hidden_layers=1,
    sscp_conv_channel_size=[4, 4],
)
GEMMA3N_WRAPPER = Spec(
    "gemma3n",
    "gemma3n",
    _config("Gemma3nConfig", text_config=GEMMA3N_TEXT, vision_config=GEMMA3N_VISION, audio_config=GEMMA3N_AUDIO),
    "image-text",
    "llama",
    perturb=True,
)


@contextlib.contextmanager
def stub_vision_tower() -> Iterator[None]:
    """transformers' Gemma 3n wrapper built (or loaded) with an empty module for its timm vision tower."""
    import torch
    import transformers
    from transformers.models.gemma3n import modeling_gemma3n

    real = modeling_gemma3n.AutoModel

    class Auto:
        @staticmethod
        def from_config(config: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(config, transformers.Gemma3nVisionConfig):
                return torch.nn.Module()
            return real.from_config(config, *args, **kwargs)

    modeling_gemma3n.AutoModel = Auto  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        modeling_gemma3n.AutoModel = real  # type: ignore[misc]


def save_gemma3n(directory: Path, seed: int = 0) -> Path:
    """The tiny ``gemma3n`` wrapper, saved as ``save_2026`` saves the others."""
    with stub_vision_tower():
        return save_2026(GEMMA3N_WRAPPER, directory, seed)
