"""--engine own against transformers, family by family, on tiny saved checkpoints.

Each family's checkpoint is built once per module (tests/builders/), loaded
through attnviz's own loading code and through transformers (eager attention), and
the two must agree on every layer's per-head weights and on the final hidden states.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from attnviz import architectures
from attnviz.architectures import supported_model_types
from attnviz.cli import hint_for
from attnviz.engines import Engine, load_engine
from attnviz.errors import UnsupportedArchitectureError

from .builders import SENTENCES, SPECS, Spec, build_tokenizer, save_tiny
from .builders.families_a import FAMILY_A_SPECS
from .helpers import inspect

TOL = 1e-5


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {spec.name: save_tiny(spec, root / spec.name) for spec in SPECS}


@pytest.fixture(scope="module")
def engines(saved: dict[str, Path]) -> dict[str, tuple[Engine, Engine]]:
    return {name: (load_engine("own", str(p), "cpu"), load_engine("hf", str(p), "cpu")) for name, p in saved.items()}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"{tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.float() - b.float()).abs().max())


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_attention_and_hidden_states_match_transformers(spec: Spec, engines: dict[str, tuple[Engine, Engine]]) -> None:
    own, hf = engines[spec.name]
    assert own.files.model_type == spec.model_type
    assert (own.num_layers, own.num_heads, own.num_kv_heads) == (hf.num_layers, hf.num_heads, hf.num_kv_heads)
    for sentence in SENTENCES:
        tokens = own.tokenize(sentence)
        ours, theirs = own.forward(tokens), hf.forward(tokens)
        assert len(ours.attentions) == len(theirs.attentions) == own.num_layers
        for layer, (a, b) in enumerate(zip(ours.attentions, theirs.attentions, strict=True)):
            assert a.shape == (1, own.num_heads, len(tokens), len(tokens))
            assert _max_diff(a, b) <= TOL, f"{spec.name} layer {layer}: {sentence!r}"
        assert _max_diff(ours.hidden_states, theirs.hidden_states) <= TOL, f"{spec.name} hidden: {sentence!r}"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_padded_batch_matches_transformers(spec: Spec, engines: dict[str, tuple[Engine, Engine]]) -> None:
    """Two sentences right-padded into one batch: padding masks (and RoBERTa's
    padding-aware positions) must agree with transformers too."""
    own, hf = engines[spec.name]
    rows = [list(own.tokenize(s).ids) for s in SENTENCES[:2]]
    width = max(map(len, rows))
    pad = int(own.model.embed.padding_idx) if spec.specials == "roberta" and spec.head != "seq2seq" else 0
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (2, S)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # (2, S)
    assert mask.min() == 0, "the sentences must differ in length for this test to mean anything"
    # An encoder-decoder's AttnModel forward is its encoder: compare with transformers' encoder.
    model = hf.model.get_encoder() if spec.head == "seq2seq" else hf.model
    with torch.inference_mode():
        ours = own.model(ids, attention_mask=mask)
        theirs = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    real = mask.bool()
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):
        # Rows of real query tokens; padded queries are not shown by attnviz.
        assert _max_diff(a.transpose(1, 2)[real], b.transpose(1, 2)[real]) <= TOL
    assert _max_diff(ours.hidden_states[real], theirs.last_hidden_state[real]) <= TOL


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_causal_structure(spec: Spec, engines: dict[str, tuple[Engine, Engine]]) -> None:
    own, hf = engines[spec.name]
    decoder = spec.head == "causal"
    assert own.causal is hf.causal is decoder
    out = own.forward(own.tokenize(SENTENCES[0]))
    above = torch.ones(out.attentions[0].shape[-2:], dtype=torch.bool).triu(1)  # (L, S): keys after the query
    for weights in out.attentions:
        if decoder:
            # Exactly 0, not merely small: a token never sees the future.
            assert bool((weights[..., above] == 0).all())
        else:
            # Bidirectional: later tokens are seen (all of them, except in ModernBERT's local layers).
            assert float(weights[..., above].max()) > 0


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_inspect_provenance_tells_views_the_structure(spec: Spec, engines: dict[str, tuple[Engine, Engine]]) -> None:
    """What ``attnviz show --model DIR`` renders from: one Attention with its provenance."""
    own, _ = engines[spec.name]
    att = inspect(SENTENCES[0], own, layers="all", queries=[2])
    p = att.provenance
    assert (p.architecture, p.engine, p.causal) == (spec.model_type, "own", spec.head == "causal")
    assert (p.num_heads, p.num_kv_heads) == (own.num_heads, own.num_kv_heads)
    assert att.weights.shape == (own.num_layers, own.num_heads, 1, len(att.tokens))
    if p.causal:
        assert (att.weights[..., 3:] == 0).all()  # token 2 sees tokens 0..2 only


@pytest.mark.parametrize("name", ["mistral", "qwen2"])
def test_sliding_window_hides_old_tokens(name: str, engines: dict[str, tuple[Engine, Engine]]) -> None:
    own, _ = engines[name]
    out = own.forward(own.tokenize(SENTENCES[0]))
    length = out.attentions[0].shape[-1]
    old = torch.ones(length, length, dtype=torch.bool).tril(-4)  # key j <= i - 4: outside a window of 4
    windowed = [layer for layer, w in enumerate(own.model.windows) if w is not None]
    # mistral: every layer; qwen2: layers from max_window_layers=1 on.
    assert windowed == ([0, 1] if name == "mistral" else [1])
    for layer, weights in enumerate(out.attentions):
        hidden = weights[..., old]
        assert bool((hidden == 0).all()) is (layer in windowed)


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2"])
def test_grouped_query_heads(name: str, engines: dict[str, tuple[Engine, Engine]]) -> None:
    own, hf = engines[name]
    assert (own.num_heads, own.num_kv_heads) == (hf.num_heads, hf.num_kv_heads) == (4, 2)
    attn = own.model.blocks[0].attn
    assert attn.k_proj.out_features == 2 * attn.head_dim  # two key/value heads are stored, not four


def test_modernbert_alternates_local_and_global_layers(engines: dict[str, tuple[Engine, Engine]]) -> None:
    own, _ = engines["modernbert"]
    model: Any = own.model
    assert model.config.layer_types == ("full_attention", "sliding_attention", "sliding_attention", "full_attention")
    assert model.config.window == 2 and (model.config.global_theta, model.config.local_theta) == (500.0, 50.0)
    out = own.forward(own.tokenize(SENTENCES[0]))
    length = out.attentions[0].shape[-1]
    positions = torch.arange(length)
    far = (positions[:, None] - positions[None, :]).abs() > 2  # (L, S): outside the local window
    for layer, weights in enumerate(out.attentions):
        if layer in (1, 2):
            assert bool((weights[..., far] == 0).all())  # local: exactly nothing beyond 2 tokens
            assert float(weights[..., ~far].min()) > 0
        else:
            assert float(weights.min()) > 0  # global: every token, both directions
    assert isinstance(model.blocks[0].attn_norm, torch.nn.Identity)  # layer 0: no attention norm


def test_deberta_states_its_score_terms(engines: dict[str, tuple[Engine, Engine]]) -> None:
    """Which disentangled terms each checkpoint's weights include, from its config, for both engines."""
    for name, terms in (("deberta-v3", ("c2c", "c2p", "p2c")), ("deberta-v2-conv", ("c2c", "c2p"))):
        for engine in engines[name]:
            assert engine.score_terms == terms
            assert inspect(SENTENCES[0], engine, layers=[0], queries=[1]).provenance.score_terms == terms
    v3: Any = engines["deberta-v3"][0].model
    assert v3.positions is None and v3.rel_norm is not None and v3.conv is None  # v3: relative positions only
    assert not hasattr(v3.blocks[0].attn, "pos_key_proj")  # share_att_key: P goes through W^K and W^Q
    v2: Any = engines["deberta-v2-conv"][0].model
    assert v2.conv is not None and hasattr(v2.blocks[0].attn, "pos_key_proj")
    assert not hasattr(v2.blocks[0].attn, "pos_query_proj")  # c2p only
    assert engines["bert"][0].score_terms == ()


def test_deberta_log_buckets_match_transformers() -> None:
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from attnviz.architectures.deberta import log_bucket_position

    relative = torch.arange(-300, 301)
    for buckets, distance in ((8, 20), (256, 512)):
        assert torch.equal(
            log_bucket_position(relative, buckets, distance), make_log_bucket_position(relative, buckets, distance)
        )
    # Exact inside ±4 for 8 buckets; beyond, log-spaced and capped near ±(buckets - 1).
    small = log_bucket_position(torch.arange(-3, 4), 8, 20)
    assert small.tolist() == list(range(-3, 4))


def test_albert_shares_one_block_across_layers(engines: dict[str, tuple[Engine, Engine]]) -> None:
    model: Any = engines["albert"][0].model
    assert len(model.blocks) == 1 and model.num_layers == 3
    assert [model.block_index(i) for i in range(3)] == [0, 0, 0]
    assert not any(name.startswith("blocks.1.") for name in model.state_dict())
    grouped: Any = engines["albert-2groups"][0].model
    assert len(grouped.blocks) == 2
    assert [grouped.block_index(i) for i in range(3)] == [0, 0, 1]


def test_albert_and_electra_project_narrow_embeddings(engines: dict[str, tuple[Engine, Engine]]) -> None:
    for name in ("albert", "electra"):
        model: Any = engines[name][0].model
        assert model.embed.tokens.embedding_dim == 20
        assert (model.project.in_features, model.project.out_features) == (20, 48)


def test_roberta_reads_positions_past_the_padding_index(engines: dict[str, tuple[Engine, Engine]]) -> None:
    own, _ = engines["roberta"]
    model: Any = own.model
    ids = torch.tensor([[0, 7, 8, 2, 1, 1]])  # <s> w w </s> <pad> <pad>
    assert model.embed.position_ids(ids).tolist() == [[2, 3, 4, 5, 1, 1]]
    # 66 position rows, of which the first two are never a real token's.
    assert own.max_positions == 64


def test_every_registered_family_is_tested() -> None:
    # Issue 23's families are tested in their own files (tests/test_families_*.py).
    from .builders.families_2026 import SPECS_2026
    from .builders.families_b import SPECS_B
    from .builders.families_c import SPECS_C
    from .builders.gemma3n import GEMMA3N_WRAPPER

    tested = (*SPECS, *FAMILY_A_SPECS, *SPECS_B, *SPECS_2026, *SPECS_C, GEMMA3N_WRAPPER)
    assert set(supported_model_types()) == {spec.model_type for spec in tested}


def _config_only_checkpoint(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    build_tokenizer("bert").save_pretrained(directory)
    return directory


def test_unsupported_model_type_names_the_supported_families(tmp_path: Path) -> None:
    # UMT5: T5 with a relative-position table in every layer, not implemented.
    from transformers import UMT5Config

    config = UMT5Config(vocab_size=101, d_model=48, num_layers=2, num_heads=3, d_kv=16, d_ff=37).to_dict()
    directory = _config_only_checkpoint(tmp_path / "umt5", config)
    with pytest.raises(UnsupportedArchitectureError) as info:
        load_engine("own", str(directory), "cpu")
    message = str(info.value)
    assert "'umt5'" in message and "--" not in message  # facts here; the CLI adds the flag
    assert "--engine hf" in (hint_for(info.value) or "")
    for model_type in ("bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "gpt2", "llama", "qwen2"):
        assert model_type in message


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("llama", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 500.0, "factor": 2.0}}),
        ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}}),
        ("albert", {"inner_group_num": 2}),
        ("bert", {"is_decoder": True}),
        ("bert", {"position_embedding_type": "relative_key"}),
        ("gpt2", {"add_cross_attention": True}),
        ("bert", {"hidden_act": "some_new_activation"}),
        ("modernbert", {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}}),
        ("modernbert", {"layer_types": ["full_attention", "chunked_attention", "full_attention", "full_attention"]}),
        ("t5", {"feed_forward_proj": "gated-relu-x"}),
        ("deberta-v3", {"pos_att_type": ["c2p", "p2p"]}),
        ("deberta-v3", {"attention_head_size": 8}),
    ],
)
def test_options_we_do_not_implement_are_refused(
    name: str, change: dict[str, Any], saved: dict[str, Path], tmp_path: Path
) -> None:
    config = {**json.loads((saved[name] / "config.json").read_text(encoding="utf-8")), **change}
    with pytest.raises(UnsupportedArchitectureError) as info:
        architectures.load(saved[name], config)
    assert "--" not in info.value.message
    assert "--engine hf" in (hint_for(info.value) or "")


def test_rope_theta_from_an_older_config_layout(saved: dict[str, Path]) -> None:
    """transformers 4 wrote rope_theta at the top level; it must mean the same θ."""
    config = json.loads((saved["llama"] / "config.json").read_text(encoding="utf-8"))
    theta = config.pop("rope_parameters")["rope_theta"]
    model: Any = architectures.load(saved["llama"], {**config, "rope_theta": theta, "rope_scaling": None})
    assert model.config.rope.theta == 500.0 and model.config.rope.rope_type == "default"
