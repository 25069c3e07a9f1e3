"""DeBERTa variants beyond the two registry checkpoints: each switch of the disentangled
attention against transformers eager (through ``attnviz check``'s comparison)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from attnviz.engines import load_engine
from attnviz.measures.check import compare_engines

from .builders import Spec, _encoder, save_tiny

VARIANTS: dict[str, dict[str, Any]] = {
    # Position terms listed but relative_attention off: no c2p/p2c, yet the scale still
    # counts them (√(3·d)), as transformers does.
    "no-relative": dict(relative_attention=False, pos_att_type=["c2p", "p2c"], type_vocab_size=2),
    # p2c alone, own position projection, distances clamped at ±5 without buckets.
    "p2c-only": dict(relative_attention=True, pos_att_type="p2c", max_relative_positions=5),
    # Both terms with own projections and buckets, relative embeddings not normed.
    "unshared-buckets": dict(relative_attention=True, pos_att_type="c2p|p2c", position_buckets=6),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_matches_transformers(name: str, tmp_path: Path) -> None:
    spec = Spec(
        name, "deberta-v2", _encoder("DebertaV2Config", max_position_embeddings=64, **VARIANTS[name]), "masked", "bert"
    )
    path = save_tiny(spec, tmp_path / name)
    result = compare_engines(str(path), device="cpu")
    assert result.passed, (result.attention, result.hidden)
    terms = load_engine("own", str(path), "cpu").score_terms
    expected = {"no-relative": ("c2c",), "p2c-only": ("c2c", "p2c"), "unshared-buckets": ("c2c", "c2p", "p2c")}
    assert terms == expected[name]
