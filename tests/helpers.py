"""Helpers for tests: tiny randomly initialised checkpoints saved into a directory."""

from __future__ import annotations

from pathlib import Path

from .conftest import EXAMPLE

__all__ = ["EXAMPLE", "save_tiny_bert"]


def save_tiny_bert(path: Path, seed: int = 0) -> Path:
    """A randomly initialised BERT (hidden 48, 3 heads, 2 layers) with its own tokenizer."""
    from .tiny_models import SPECS_BY_NAME, save_tiny

    return save_tiny(SPECS_BY_NAME["bert"], path, seed=seed)
