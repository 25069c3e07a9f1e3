"""Sentence pairs for BERT-likes (bertviz's ``sentence_b``): the tokenizer's pair
template, token types 0/1 fed to the model as it was trained, and the boundary in
the views."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnviz.engines import Engine, load_engine
from attnviz.errors import UsageError
from attnviz.result import Attention
from attnviz.tokens import PAIR_SEPARATOR, find_word

from .builders import SPECS, Spec, save_tiny
from .helpers import inspect

TOL = 1e-5
FIRST, SECOND = "The cat sat on the mat.", "It was too tired to move."
ENCODERS = tuple(spec for spec in SPECS if spec.head == "masked")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pairs")
    return {spec.name: save_tiny(spec, root / spec.name) for spec in ENCODERS}


def test_pair_tokens_are_what_transformers_tokenizer_gives(minilm_dir: Path, own_engine: Engine) -> None:
    from transformers import AutoTokenizer

    tokens = own_engine.tokenize_pair(FIRST, SECOND)
    theirs = AutoTokenizer.from_pretrained(str(minilm_dir))(FIRST, SECOND)
    assert list(tokens.ids) == theirs["input_ids"]
    assert list(tokens.type_ids) == theirs["token_type_ids"]
    # [CLS] the cat sat on the mat . [SEP] | it was too tired to move . [SEP]
    assert tokens.pair_start == 9 and tokens.pieces[8] == "[SEP]" and tokens.labels[9] == "It"
    assert tokens.text == FIRST + PAIR_SEPARATOR + SECOND
    # B's offsets point into the joined text, so words of B are found by text.
    assert find_word(tokens, "tired") == (12,)
    assert tokens.labels[9:16] == ("It", "was", "too", "tired", "to", "move", ".")


def test_token_types_reach_the_model(own_engine: Engine, hf_engine: Engine) -> None:
    """Sentence B embedded as type 1: the weights agree with transformers fed the same
    types, and differ from the same ids read as one segment."""
    tokens = own_engine.tokenize_pair(FIRST, SECOND)
    ours, theirs = own_engine.forward(tokens), hf_engine.forward(tokens)
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):
        assert float((a - b).abs().max()) <= TOL
    one_segment = own_engine.forward(
        type(tokens)(tokens.text, tokens.ids, tokens.pieces, tokens.offsets, tokens.special)
    )
    moved = max(float((a - b).abs().max()) for a, b in zip(ours.attentions, one_segment.attentions, strict=True))
    assert moved > 1e-3


@pytest.mark.parametrize("spec", ENCODERS, ids=lambda s: s.name)
def test_pairs_match_transformers_in_every_bert_like(spec: Spec, saved: dict[str, Path]) -> None:
    from transformers import AutoModel, AutoTokenizer

    own = load_engine("own", str(saved[spec.name]), "cpu")
    tokens = own.tokenize_pair("the cat sat on the mat", "the dog sat by the door")
    # Independently: transformers' tokenizer and model, token types as its tokenizer gives them.
    encoded = AutoTokenizer.from_pretrained(str(saved[spec.name]))(
        "the cat sat on the mat", "the dog sat by the door", return_tensors="pt", return_token_type_ids=True
    )
    assert tokens.ids == tuple(encoded["input_ids"][0].tolist())
    model = AutoModel.from_pretrained(str(saved[spec.name]), attn_implementation="eager").eval()
    inputs = {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if spec.model_type == "distilbert":
        inputs.pop("token_type_ids", None)  # DistilBERT has no token types
    with torch.inference_mode():
        theirs = model(**inputs, output_attentions=True)
    ours = own.forward(tokens)
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):
        assert float((a - b).abs().max()) <= TOL
    assert float((ours.hidden_states - theirs.last_hidden_state).abs().max()) <= TOL
    if spec.specials == "bert":
        assert set(tokens.type_ids) == {0, 1}


def test_views_mark_the_boundary(own_engine: Engine) -> None:
    from rich.console import Console

    from attnviz.render.image import matrix_figure, token_figure
    from attnviz.render.terminal import PAIR_RULE, for_console, render_show

    tokens = own_engine.tokenize_pair(FIRST, SECOND)
    att = inspect(tokens, own_engine, layers=[0], queries=[12])
    console = Console(record=True, width=200, color_system=None)
    console.print(render_show(att, (12,), **for_console(console)))
    text = console.export_text()
    assert "sentence pair" in text and "at token 9 ('It')" in text
    header = next(line for line in text.splitlines() if "[CLS]" in line and "tired" in line)
    assert header.index(PAIR_RULE) < header.index(" It ") and header.index("[SEP]") < header.index(PAIR_RULE)
    fig = token_figure(att, 12)
    assert any(np.allclose(line.get_xdata(), 8.5) for line in fig.axes[0].lines)
    full = inspect(tokens, own_engine, layers=[0])
    fig = matrix_figure(full, 0)
    xs = {float(line.get_xdata()[0]) for line in fig.axes[0].lines}
    ys = {float(line.get_ydata()[0]) for line in fig.axes[0].lines}
    assert 8.5 in xs and 8.5 in ys


def test_pair_survives_json_and_npz(own_engine: Engine, tmp_path: Path) -> None:
    att = inspect(own_engine.tokenize_pair(FIRST, SECOND), own_engine, layers=[0], queries=[3])
    out = att.to_dict(3)
    assert out["pair_start"] == 9 and out["type_ids"][8:10] == [0, 1]
    att.save_npz(tmp_path / "p.npz")
    back = Attention.load_npz(tmp_path / "p.npz")
    assert back.tokens == att.tokens


def test_public_inspect_takes_a_pair(own_engine: Engine) -> None:
    import attnviz

    att = attnviz.inspect(FIRST, "tired", pair=SECOND, layers=[0], device="cpu")
    assert att.queries == (12,) and att.tokens.pair_start == 9


def test_pairs_are_refused_where_they_mean_nothing(own_engine: Engine) -> None:
    with pytest.raises(UsageError, match="empty"):
        own_engine.tokenize_pair(FIRST, "  ")
