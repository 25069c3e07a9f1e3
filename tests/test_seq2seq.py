"""Encoder-decoders (T5, mT5, BART, mBART): every part of --engine own against
transformers eager, on tiny saved checkpoints loaded through the real path.

The three parts: encoder self-attention (source -> source), decoder self-attention
(target -> target, causal) and cross-attention (target -> source).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnviz.engines import Engine, load_engine
from attnviz.errors import UsageError
from attnviz.pipeline import choose_part
from attnviz.result import Attention

from .builders import SENTENCES, SPECS, save_tiny
from .helpers import inspect

TOL = 1e-5
SEQ2SEQ = tuple(spec for spec in SPECS if spec.head == "seq2seq")
# (source, target): lengths differ, so a transposed cross-attention cannot pass.
PAIRS = (
    (SENTENCES[0], "the cat sat on the mat"),
    (SENTENCES[2], SENTENCES[1]),
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seq2seq")
    return {spec.name: save_tiny(spec, root / spec.name) for spec in SEQ2SEQ}


@pytest.fixture(scope="module")
def engines(saved: dict[str, Path]) -> dict[str, tuple[Engine, Engine]]:
    return {name: (load_engine("own", str(p), "cpu"), load_engine("hf", str(p), "cpu")) for name, p in saved.items()}


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"{tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.double() - b.double()).abs().max())


def test_the_seq2seq_families_are_all_here() -> None:
    assert {spec.model_type for spec in SEQ2SEQ} == {"t5", "mt5", "bart", "mbart"}


@pytest.mark.parametrize("name", [s.name for s in SEQ2SEQ])
def test_every_part_matches_transformers(name: str, engines: dict[str, tuple[Engine, Engine]]) -> None:
    own, hf = engines[name]
    assert own.parts == hf.parts == ("encoder", "decoder", "cross")
    for part in own.parts:
        assert own.part_shape(part) == hf.part_shape(part), part
    for source, target in PAIRS:
        tokens, target_tokens = own.tokenize(source), own.tokenize_target(target)
        assert hf.tokenize_target(target) == target_tokens
        ours, theirs = own.forward_seq2seq(tokens, target_tokens), hf.forward_seq2seq(tokens, target_tokens)
        for part in own.parts:
            shape = own.part_shape(part)
            a, b = ours.part(part), theirs.part(part)
            assert len(a.attentions) == len(b.attentions) == shape.num_layers
            keys = len(tokens) if part != "decoder" else len(target_tokens)
            queries = len(tokens) if part == "encoder" else len(target_tokens)
            for layer, (x, y) in enumerate(zip(a.attentions, b.attentions, strict=True)):
                assert x.shape == (1, shape.num_heads, queries, keys)
                assert _diff(x, y) <= TOL, f"{name} {part} layer {layer}"
            assert _diff(a.hidden_states, b.hidden_states) <= TOL, f"{name} {part} hidden"


@pytest.mark.parametrize("name", [s.name for s in SEQ2SEQ])
def test_padded_batches_on_both_sides_match_transformers(name: str, engines: dict[str, tuple[Engine, Engine]]) -> None:
    own, hf = engines[name]
    sources = [list(own.tokenize(s).ids) for s, _ in PAIRS]
    targets = [list(own.tokenize_target(t).ids) for _, t in PAIRS]

    def pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, rows))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])  # (2, S)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # (2, S)
        assert mask.min() == 0, "the texts must differ in length for this test to mean anything"
        return ids, mask

    (src, src_mask), (tgt, tgt_mask) = pad(sources), pad(targets)
    with torch.inference_mode():
        ours = own.model.forward_seq2seq(src, tgt, src_mask, tgt_mask)
        theirs = hf.model(
            input_ids=src,
            attention_mask=src_mask,
            decoder_input_ids=tgt,
            decoder_attention_mask=tgt_mask,
            output_attentions=True,
        )
    real_src, real_tgt = src_mask.bool(), tgt_mask.bool()
    pairs = (
        (ours.encoder.attentions, theirs.encoder_attentions, real_src),
        (ours.decoder.attentions, theirs.decoder_attentions, real_tgt),
        (ours.cross, theirs.cross_attentions, real_tgt),
    )
    for mine, hfs, real in pairs:
        for x, y in zip(mine, hfs, strict=True):
            # Rows of real query tokens; attnviz never shows a padding query.
            assert _diff(x.transpose(1, 2)[real], y.transpose(1, 2)[real]) <= TOL
    assert _diff(ours.encoder.hidden_states[real_src], theirs.encoder_last_hidden_state[real_src]) <= TOL
    assert _diff(ours.decoder.hidden_states[real_tgt], theirs.last_hidden_state[real_tgt]) <= TOL
    for weights in ours.cross:  # padded source tokens get exactly nothing
        assert bool((weights[1][..., ~real_src[1]] == 0).all())


@pytest.mark.parametrize("name", [s.name for s in SEQ2SEQ])
def test_decoder_is_causal_and_cross_attention_sees_the_whole_source(
    name: str, engines: dict[str, tuple[Engine, Engine]]
) -> None:
    own, _ = engines[name]
    out = own.forward_seq2seq(own.tokenize(PAIRS[0][0]), own.tokenize_target(PAIRS[0][1]))
    future = torch.ones(out.decoder.attentions[0].shape[-2:], dtype=torch.bool).triu(1)  # (L, L)
    for weights in out.decoder.attentions:
        assert bool((weights[..., future] == 0).all())  # exactly 0: never the future
    for weights in (*out.encoder.attentions, *out.cross):
        assert float(weights.min()) > 0  # bidirectional: every source token is seen
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-6)


def test_t5_relative_position_buckets_match_transformers() -> None:
    """Every distance from -40 to 40 in both directions, with the tiny model's 8 buckets and
    max distance 12 and with T5's defaults (32, 128): the log-spaced buckets and the cap."""
    from transformers.models.t5.modeling_t5 import T5Attention

    from attnviz.architectures.t5 import relative_position_bucket

    relative = torch.arange(-40, 41)[None, :] - torch.zeros(3, 1, dtype=torch.long)  # (3, 81)
    for buckets, distance in ((8, 12), (32, 128)):
        for bidirectional in (True, False):
            ours = relative_position_bucket(relative, bidirectional, buckets, distance)
            theirs = T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
            assert torch.equal(ours, theirs)
            assert int(ours.max()) < buckets
    # Worked by hand (decoder, 8 buckets, max distance 12): distances 0..3 are exact; 4 and
    # more share log-spaced buckets 4 + floor(log(d/4) / log(3) · 4), capped at 7; the future is 0.
    ours = relative_position_bucket(torch.tensor([-12, -6, -5, -4, -3, 0, 5]), False, 8, 12)
    expected = [min(7, 4 + math.floor(math.log(d / 4) / math.log(3) * 4)) if d >= 4 else d for d in (12, 6, 5, 4, 3, 0)]
    assert ours.tolist() == [*expected, 0]


def test_t5_scores_are_not_scaled_and_bart_embeddings_are(engines: dict[str, tuple[Engine, Engine]]) -> None:
    t5: Any = engines["t5"][0].model
    assert t5.encoder.blocks[0].attn.scale == 1.0
    assert t5.max_positions is None
    bart: Any = engines["bart"][0].model
    assert bart.embed_scale == math.sqrt(48) and bart.encoder.blocks[0].pre_norm is False
    mbart: Any = engines["mbart"][0].model
    assert mbart.embed_scale == 1.0 and mbart.encoder.blocks[0].pre_norm is True
    assert mbart.encoder.final_norm is not None and bart.encoder.final_norm is None
    # BART reads positions 0..S-1 from rows 2..S+1 of a table 2 rows longer than its limit.
    assert bart.encoder_positions.num_embeddings == 64 + 2


def test_decoder_text_starts_with_the_decoder_start_token(engines: dict[str, tuple[Engine, Engine]]) -> None:
    # T5: pad (0) then the target and </s>; BART: decoder_start_token_id (2, </s>) then <s> target </s>.
    t5 = engines["t5"][0].tokenize_target("the cat")
    assert t5.pieces == ("<pad>", "the", "cat", "</s>") and t5.special == (True, False, False, True)
    bart = engines["bart"][0].tokenize_target("the cat")
    assert bart.pieces == ("</s>", "<s>", "the", "cat", "</s>") and bart.text == "the cat"
    # mBART saves no decoder_start_token_id: its last label token wraps around.
    mbart = engines["mbart"][0].tokenize_target("the cat")
    assert mbart.ids[0] == mbart.ids[-1]


def test_inspect_cross_attention_has_target_queries_and_source_keys(engines: dict[str, tuple[Engine, Engine]]) -> None:
    own, hf = engines["bart"]
    source, target = PAIRS[0]
    att = inspect(source, own, layers="all", queries=[3], target=target, part="cross")
    assert att.part == "cross" and not att.is_self_attention
    assert att.tokens == own.tokenize_target(target) and att.keys == own.tokenize(source)
    p = att.provenance
    assert (p.num_layers, p.num_heads, p.causal) == (3, 4, False)  # the decoder's shape
    assert att.weights.shape == (3, 4, 1, len(att.keys))
    theirs = inspect(source, hf, layers="all", queries=[3], target=target, part="cross")
    assert np.abs(att.weights - theirs.weights).max() <= TOL
    decoder = inspect(source, own, layers=[0], target=target, part="decoder")
    assert decoder.provenance.causal and decoder.is_self_attention and decoder.part == "decoder"
    encoder = inspect(source, own, layers=[0])  # no decoder text: the encoder
    assert encoder.part == "encoder" and encoder.provenance.num_heads == 3


def test_choose_part_defaults_and_refusals(engines: dict[str, tuple[Engine, Engine]], own_engine: Engine) -> None:
    t5 = engines["t5"][0]
    assert choose_part(t5, None, False) == "encoder"
    assert choose_part(t5, None, True) == "cross"
    assert choose_part(t5, "decoder", True) == "decoder"
    with pytest.raises(UsageError, match="needs the decoder text"):
        choose_part(t5, "cross", False)
    with pytest.raises(UsageError, match="unknown part 'crosss'"):
        choose_part(t5, "crosss", True)
    assert choose_part(own_engine, None, False) is None  # MiniLM: one stack
    with pytest.raises(UsageError, match="not an encoder-decoder"):
        choose_part(own_engine, "cross", False)
    with pytest.raises(UsageError, match="needs an encoder-decoder"):
        choose_part(own_engine, None, True)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_each_parts_pattern_taps_are_that_parts_weights(
    name: str, engines: dict[str, tuple[Engine, Engine]], own_engine: Engine
) -> None:
    """``tapping``: each part's ``pattern`` taps (``blocks.N.attn``, ``decoder.blocks.N.attn``,
    ``decoder.blocks.N.cross``), in layer order, record the weights the pass returns for
    that part's layers, on both engines; a part the model lacks is refused."""
    from attnviz.nn.taps import Taps, tap_name

    source, target = PAIRS[0]
    for engine in engines[name]:
        taps = Taps()
        for part in engine.parts:
            for layer in engine.part_shape(part).layers:
                taps.record(tap_name(part, layer, "pattern"))
        with engine.tapping(taps):
            out = engine.forward_seq2seq(engine.tokenize(source), engine.tokenize_target(target))
        want = {"encoder": out.encoder.attentions, "decoder": out.decoder.attentions, "cross": out.cross}
        for part in engine.parts:
            layers = engine.part_shape(part).layers
            assert len(layers) == engine.part_shape(part).num_layers == len(want[part]), part
            for layer, b in zip(layers, want[part], strict=True):
                recorded = taps.recorded[tap_name(part, layer, "pattern")]
                assert len(recorded) == 1, (engine.name, part, layer)
                assert torch.equal(recorded[0], b), (engine.name, part, layer)
    assert tap_name(None, 0, "pattern") == tap_name("encoder", 0, "pattern")
    with pytest.raises(UsageError, match="has no decoder"):
        own_engine.tapping(Taps().record(tap_name("cross", 0, "pattern")))


def test_cross_attention_survives_json_and_npz(engines: dict[str, tuple[Engine, Engine]], tmp_path: Path) -> None:
    own, _ = engines["t5"]
    att = inspect(PAIRS[0][0], own, layers=[1], target=PAIRS[0][1], part="cross")
    out = att.to_dict(query=2)
    assert out["part"] == "cross" and out["key_tokens"] == list(att.keys.labels)
    assert len(out["weights"][0][0]) == len(att.keys) != len(att.tokens)
    att.save_npz(tmp_path / "a.npz")
    back = Attention.load_npz(tmp_path / "a.npz")
    assert back.part == "cross" and back.keys == att.keys and back.tokens == att.tokens
    assert np.array_equal(back.weights, att.weights)


def test_cross_attention_matrix_figure_labels_target_rows_and_source_columns(
    engines: dict[str, tuple[Engine, Engine]],
) -> None:
    from attnviz.render.image import matrix_figure

    own, _ = engines["bart"]
    source, target = PAIRS[0]
    att = inspect(source, own, layers=[1], target=target, part="cross")
    fig = matrix_figure(att, 1)
    ax = fig.axes[0]
    assert ax.images[0].get_array().shape == (len(att.tokens), len(att.keys))  # (target, source)
    # Labels sit on the outer panels only: gather them from every head's panel.
    panels = fig.axes[: att.num_heads]
    columns = [t.get_text() for a in panels for t in a.get_xticklabels()]
    rows = [t.get_text() for a in panels for t in a.get_yticklabels()]
    assert set(columns) <= set(att.keys.labels) and "animal" in columns
    assert set(rows) <= set(att.tokens.labels) and "cat" in rows


@pytest.mark.parametrize(
    ("cls", "extra"),
    [
        ("T5Config", {"feed_forward_proj": "gated-silu", "num_decoder_layers": 1}),
        ("T5Config", {"feed_forward_proj": "gelu", "relative_attention_num_buckets": 32}),
        ("BartConfig", {"activation_function": "relu", "scale_embedding": False, "encoder_attention_heads": 6}),
    ],
    ids=["t5-gated-silu", "t5-gelu-32-buckets", "bart-relu"],
)
def test_more_variants_match_transformers_in_every_part(cls: str, extra: dict[str, Any], tmp_path: Path) -> None:
    from attnviz.measures.check import compare_engines

    from .builders import _BART, _T5, Spec, _seq2seq

    base = _T5 if cls == "T5Config" else _BART
    spec = Spec(
        "variant",
        cls[:-6].lower(),
        _seq2seq(cls, **{**base, **extra}),
        "seq2seq",
        "t5" if cls == "T5Config" else "roberta",
    )
    result = compare_engines(str(save_tiny(spec, tmp_path / "variant")), device="cpu")
    assert [p.part for p in result.parts] == ["encoder", "decoder", "cross"]
    assert result.passed, result.failed
