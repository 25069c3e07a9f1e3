"""Helpers for tests: tiny randomly initialised checkpoints saved into a directory."""

from __future__ import annotations

from pathlib import Path

EXAMPLE = "The animal didn't cross the street because it was too tired"


def save_tiny_bert(path: Path, seed: int = 0, **overrides: object) -> Path:
    """A randomly initialised BertModel at odd sizes, with the packaged MiniLM's
    tokenizer (vocab trimmed is not needed: ids stay below vocab_size by construction)."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from attnviz.models import packaged_model_dir

    config = BertConfig(
        vocab_size=30522,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=72,
        max_position_embeddings=64,
        **overrides,
    )
    torch.manual_seed(seed)
    model = BertModel(config).eval()
    model.save_pretrained(path)
    shutil.copy(packaged_model_dir() / "tokenizer.json", path / "tokenizer.json")
    return path
