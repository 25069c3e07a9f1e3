"""Our BERT stack against transformers' BertModel (eager attention)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnviz.engines import load_engine
from attnviz.errors import ModelLoadError
from attnviz.example import EXAMPLE

from .builders import Spec, _config, build_tiny
from .helpers import save_tiny_bert

SENTENCES = [
    EXAMPLE,
    "The animal didn't cross the street because it was too wide",
    "The trophy doesn't fit into the brown suitcase because it is too large.",
    "A",
    "Tokenization splits unfamiliar words like antidisestablishmentarianism into pieces.",
    "The city councilmen refused the demonstrators a permit because they feared violence.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "1, 2, 3 — numbers, punctuation; and émigré accents!",
    'She said: "it\'s raining" and left.',
    "the the the the the the the the the the the the",
    "Attention heads in layer three often track coreference between a pronoun and its antecedent.",
]


def _max_diffs(own, hf, sentence: str) -> tuple[float, float]:
    tokens = own.tokenize(sentence)
    a, b = own.forward(tokens), hf.forward(tokens)
    assert len(a.attentions) == len(b.attentions) == own.num_layers
    att = max((x - y).abs().max().item() for x, y in zip(a.attentions, b.attentions))
    hid = (a.hidden_states - b.hidden_states).abs().max().item()
    return att, hid


@pytest.mark.parametrize("sentence", SENTENCES)
def test_packaged_minilm_matches_transformers(own_engine, hf_engine, sentence: str) -> None:
    att, hid = _max_diffs(own_engine, hf_engine, sentence)
    assert att <= 1e-5
    assert hid <= 1e-4  # hidden states are O(1) values after 6 layers; attention is the 1e-5 contract


def test_example_has_a_head_linking_it_to_animal(own_engine) -> None:
    from attnviz.tokens import find_word

    from .helpers import inspect

    tokens = own_engine.tokenize(EXAMPLE)
    (it,) = find_word(tokens, "it")
    (animal,) = find_word(tokens, "animal")
    att = inspect(tokens, own_engine, 3, (it,))
    weights = att.rows(it)[0, :, animal]  # (H,)
    assert weights.max() > 0.5  # one head of layer 3 resolves "it" -> "animal"
    assert int(weights.argmax()) == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_tiny_random_bert_through_the_loading_path(tmp_path: Path, seed: int) -> None:
    save_tiny_bert(tmp_path, seed=seed)
    own = load_engine("own", str(tmp_path), "cpu")
    hf = load_engine("hf", str(tmp_path), "cpu")
    assert (own.num_layers, own.num_heads) == (2, 3)
    for sentence in SENTENCES[:4]:
        att, hid = _max_diffs(own, hf, sentence)
        assert att <= 1e-5
        assert hid <= 1e-5


# BERT's own vocabulary size (the packaged tokenizer's), gelu_new, transformers' default
# initializer_range; 5 heads of 6 dims, 3 layers.
GELU_NEW_BERT = Spec(
    "bert-gelu-new",
    "bert",
    _config(
        "BertConfig",
        hidden_size=30,
        num_hidden_layers=3,
        num_attention_heads=5,
        intermediate_size=40,
        hidden_act="gelu_new",
        max_position_embeddings=40,
    ),
    "masked",
    "bert",
)


def test_tiny_bert_with_gelu_new_and_prefixed_weights(tmp_path: Path) -> None:
    """A BertForMaskedLM checkpoint stores 'bert.'-prefixed names and an LM head we ignore."""
    import shutil

    from attnviz.io.models import packaged_model_dir

    build_tiny(GELU_NEW_BERT, seed=5).save_pretrained(tmp_path)
    shutil.copy(packaged_model_dir() / "tokenizer.json", tmp_path)
    own = load_engine("own", str(tmp_path), "cpu")
    hf = load_engine("hf", str(tmp_path), "cpu")
    att, hid = _max_diffs(own, hf, EXAMPLE)
    assert att <= 1e-5 and hid <= 1e-5


def test_padding_mask_in_a_batch(own_engine, hf_engine) -> None:
    """Padded keys get exactly zero weight and the real tokens' weights match transformers."""
    long, short = own_engine.tokenize(EXAMPLE), own_engine.tokenize("The animal was tired")
    s = len(long)
    ids = torch.zeros(2, s, dtype=torch.long)
    ids[0] = torch.tensor(long.ids)
    ids[1, : len(short)] = torch.tensor(short.ids)
    mask = torch.zeros(2, s, dtype=torch.long)
    mask[0] = 1
    mask[1, : len(short)] = 1
    with torch.inference_mode():
        ours = own_engine.model(ids, attention_mask=mask)
        ref = hf_engine.model(input_ids=ids, attention_mask=mask, output_attentions=True)
    n = len(short)
    for a, b in zip(ours.attentions, ref.attentions):
        assert torch.all(a[1, :, :, n:] == 0.0)
        assert (a[:, :, :n] - b[:, :, :n]).abs().max().item() <= 1e-5  # real query rows
        assert (a[0] - b[0]).abs().max().item() <= 1e-5


def test_truncated_weights_are_a_clear_error(tmp_path: Path) -> None:
    save_tiny_bert(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="cannot read weights|corrupt or truncated"):
        load_engine("own", str(tmp_path), "cpu")


def test_missing_tensor_is_a_clear_error(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_tiny_bert(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["bert.encoder.layer.1.attention.self.key.weight"]  # saved from BertForMaskedLM
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"lacks weights.*blocks\.1\.attn\.k_proj\.weight"):
        load_engine("own", str(tmp_path), "cpu")


def test_config_that_disagrees_with_weights(tmp_path: Path) -> None:
    import json

    save_tiny_bert(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = 80
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="shape"):
        load_engine("own", str(tmp_path), "cpu")
