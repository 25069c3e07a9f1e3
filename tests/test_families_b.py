"""Issue 23, second half (families-b): defect D2 and the own-engine stacks of OLMo 1,
OLMoE, CamemBERT, MPNet, StableLM, Granite, Cohere, Starcoder2, SmolLM3, Qwen2-MoE,
Marian and Pegasus, each against transformers eager on a tiny checkpoint with every
quirk switched on (tests/builders/families_b.py), float32 on the CPU:

* the row path (``OwnEngine.forward``, what ``show`` runs: fused attention with exact
  rows, for every row and for a few asked rows) and the eager path (what ``check``
  runs, ``fused=False``), sentence by sentence and in a padded batch;
* ``attnviz check`` and ``attnviz show`` through the CLI;
* each quirk matters: switched off, the numbers no longer match.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from attnviz import architectures
from attnviz.engines import Engine, load_engine
from attnviz.errors import ModelLoadError
from attnviz.io.checkpoint import validate_config

from .builders import SENTENCES, save_tiny
from .builders.families_b import SPECS_B, SPECS_B_BY_NAME

TOL = 1e-5
ONE_STACK = tuple(spec for spec in SPECS_B if spec.head != "seq2seq")
SEQ2SEQ = tuple(spec for spec in SPECS_B if spec.head == "seq2seq")


class _Saved(dict[str, Path]):
    """Tiny checkpoints saved on first use (a test of one family builds only its own)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        self[name] = path = save_tiny(SPECS_B_BY_NAME[name], self.root / name)
        return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Saved(tmp_path_factory.mktemp("families_b"))


def _config(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "config.json").read_text(encoding="utf-8")))


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"{tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.double() - b.double()).abs().max())


# --- D2: Qwen2-MoE's "sliding_window": 0 -------------------------------------------------


def test_d2_transformers_saves_qwen2_moe_with_a_zero_window(saved: dict[str, Path]) -> None:
    config = _config(saved["qwen2_moe-no-window"])
    assert config["sliding_window"] == 0 and config["use_sliding_window"] is False


def test_d2_a_zero_window_that_is_off_passes_the_checkpoint_check(saved: dict[str, Path]) -> None:
    validate_config(_config(saved["qwen2_moe-no-window"]))  # raised "sliding_window is 0" before


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_d2_a_zero_window_that_is_off_loads_under_both_engines(engine: str, saved: dict[str, Path]) -> None:
    loaded = load_engine(engine, str(saved["qwen2_moe-no-window"]), "cpu")
    assert loaded.num_layers == 3
    if engine == "own":
        assert list(loaded.model.windows) == [None, None, None]  # type: ignore[attr-defined]


def test_d2_check_passes_on_the_saved_config(saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    result = CliRunner().invoke(app, ["check", "--model", str(saved["qwen2_moe-no-window"]), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] is True and data["worst"] <= TOL


def test_d2_show_runs_under_the_hf_engine(saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    args = ["show", SENTENCES[0], "--model", str(saved["qwen2_moe-no-window"]), "--engine", "hf"]
    result = CliRunner().invoke(app, [*args, "--token", "cross", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["provenance"]["architecture"] == "qwen2_moe"


@pytest.mark.parametrize(
    "config",
    [
        {"sliding_window": 0, "use_sliding_window": True},  # a window of 0 that is on
        {"sliding_window": 0},  # Mistral-style: no switch, the window is always on
        {"sliding_window": -1, "use_sliding_window": False},
    ],
)
def test_d2_a_zero_window_in_use_is_still_refused(config: dict[str, Any]) -> None:
    with pytest.raises(ModelLoadError, match="sliding_window is"):
        validate_config(config)


# --- every family against transformers ----------------------------------------------------

_ENGINES: dict[str, tuple[Engine, Engine]] = {}


def _engines(name: str, saved: dict[str, Path]) -> tuple[Engine, Engine]:
    """The own and the hf engine of one tiny checkpoint, loaded once per module."""
    if name not in _ENGINES:
        _ENGINES[name] = (load_engine("own", str(saved[name]), "cpu"), load_engine("hf", str(saved[name]), "cpu"))
    return _ENGINES[name]


@pytest.mark.parametrize("spec", ONE_STACK, ids=lambda s: s.name)
def test_row_path_and_eager_path_match_transformers(spec: Any, saved: dict[str, Path]) -> None:
    """``show``'s path (fused attention, exact rows: every row, and two asked rows) and
    ``check``'s (the eager reference) against transformers eager, sentence by sentence."""
    own, hf = _engines(spec.name, saved)
    assert own.files.model_type == spec.model_type
    # (Not causal: the hf engine's flag comes from a hand-kept list that misses OLMoE and
    # SmolLM3, defect D1, fixed on families-a.)
    assert (own.num_layers, own.num_heads, own.num_kv_heads) == (hf.num_layers, hf.num_heads, hf.num_kv_heads)
    assert own.causal is (spec.head == "causal")
    for sentence in SENTENCES:
        tokens = own.tokenize(sentence)
        theirs = hf.forward(tokens)
        rows = own.forward(tokens)
        asked = (1, len(tokens) - 1)
        some = own.forward(tokens, queries=asked)
        with torch.inference_mode():
            eager = own.model(torch.tensor([tokens.ids]), fused=False)  # type: ignore[operator]
        assert len(rows.attentions) == len(eager.attentions) == len(theirs.attentions) == own.num_layers
        for layer, b in enumerate(theirs.attentions):
            assert _diff(rows.attentions[layer], b) <= TOL, f"{spec.name} rows, layer {layer}: {sentence!r}"
            assert _diff(some.attentions[layer], b[:, :, list(asked)]) <= TOL, f"{spec.name} asked rows {layer}"
            assert _diff(eager.attentions[layer], b) <= TOL, f"{spec.name} eager, layer {layer}: {sentence!r}"
        for out in (rows, some, eager):
            assert _diff(out.hidden_states, theirs.hidden_states) <= TOL, f"{spec.name} hidden: {sentence!r}"


@pytest.mark.parametrize("spec", ONE_STACK, ids=lambda s: s.name)
def test_padded_batch_matches_transformers(spec: Any, saved: dict[str, Path]) -> None:
    """Three sentences right-padded (with the config's pad id) into one batch, eager and fused."""
    own, hf = _engines(spec.name, saved)
    batch = [own.tokenize(s) for s in SENTENCES]
    ids, mask = own._padded(batch)  # type: ignore[attr-defined]
    assert mask.min() == 0, "the sentences must differ in length for this test to mean anything"
    with torch.inference_mode():
        theirs = hf.model(input_ids=ids, attention_mask=mask, output_attentions=True)  # type: ignore[attr-defined]
        outs = [own.model(ids, attention_mask=mask, fused=fused) for fused in (False, True)]  # type: ignore[operator]
    real = mask.bool()
    for ours in outs:
        for a, b in zip(ours.attentions, theirs.attentions, strict=True):
            # Rows of real query tokens; attnviz never shows a padding query.
            assert _diff(a.transpose(1, 2)[real], b.transpose(1, 2)[real]) <= TOL
        for row in range(len(batch)):  # padding keys get exactly nothing
            assert bool((ours.attentions[0][row][..., ~real[row]] == 0).all())
        assert _diff(ours.hidden_states[real], theirs.last_hidden_state[real]) <= TOL


@pytest.mark.parametrize("spec", SPECS_B, ids=lambda s: s.name)
def test_cli_check_passes(spec: Any, saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    result = CliRunner().invoke(app, ["check", "--model", str(saved[spec.name]), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] is True and data["model_type"] == spec.model_type and data["worst"] <= TOL


@pytest.mark.parametrize("spec", ONE_STACK, ids=lambda s: s.name)
def test_cli_show_matches_the_hf_engine(spec: Any, saved: dict[str, Path]) -> None:
    """``attnviz show --json`` for every layer, own against hf (the JSON rounds to 1e-6)."""
    from attnviz.cli import app

    def show(engine: str) -> dict[str, Any]:
        args = ["show", SENTENCES[0], "--model", str(saved[spec.name]), "--engine", engine, "--token", "it"]
        result = CliRunner().invoke(app, [*args, "--layer", "all", "--json"])
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.stdout))

    ours, theirs = show("own"), show("hf")
    assert ours["provenance"]["architecture"] == spec.model_type and ours["tokens"] == theirs["tokens"]
    a, b = torch.tensor(ours["weights"]), torch.tensor(theirs["weights"])
    assert a.shape == b.shape and _diff(a, b) <= TOL


# --- each quirk matters ---------------------------------------------------------------------

QUIRKS: list[tuple[str, dict[str, Any]]] = [
    ("olmo", {"clip_qkv": None}),
    ("olmoe", {"clip_qkv": None}),
    ("olmoe", {"norm_topk_prob": False}),
    ("stablelm", {"qk_layernorm": False}),
    ("stablelm", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0}}),
    ("stablelm", {"use_qkv_bias": False}),
    ("stablelm-sequential", {"use_parallel_residual": True}),
    ("granite", {"embedding_multiplier": 1.0}),
    ("granite", {"attention_multiplier": 0.25}),  # 1/√D, Llama's
    ("granite", {"residual_multiplier": 1.0}),
    ("cohere", {"use_qk_norm": False}),
    ("cohere", {"attention_bias": False}),
    ("starcoder2", {"sliding_window": None}),
    ("starcoder2", {"use_bias": False}),
    ("smollm3", {"no_rope_layers": [1, 1, 1]}),
    ("smollm3", {"layer_types": ["full_attention"] * 3}),
    ("qwen2_moe", {"norm_topk_prob": True}),
    ("qwen2_moe", {"layer_types": ["full_attention"] * 3}),
    ("marian", {"scale_embedding": False}),
    ("pegasus", {"scale_embedding": False}),
]


def _worst(model: Any, hf: Any, ids: torch.Tensor) -> float:
    """Largest |ours - transformers'| over every layer's weights and the final hidden states."""
    with torch.inference_mode():
        ours = model(ids, fused=False)
        theirs = hf(input_ids=ids, output_attentions=True)
    diffs = [_diff(a, b) for a, b in zip(ours.attentions, theirs.attentions, strict=True)]
    return max(*diffs, _diff(ours.hidden_states, theirs.last_hidden_state))


@pytest.mark.parametrize(("name", "change"), QUIRKS, ids=[f"{n}-{'-'.join(c)}" for n, c in QUIRKS])
def test_each_quirk_changes_the_numbers(name: str, change: dict[str, Any], saved: dict[str, Path]) -> None:
    """Read with the quirk switched off, our model must disagree with transformers: the
    tiny checkpoints exercise every quirk, so the comparison tests can fail."""
    own, hf = _engines(name, saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    hf_model = hf.model.get_encoder() if SPECS_B_BY_NAME[name].head == "seq2seq" else hf.model  # type: ignore[attr-defined]
    assert _worst(own.model, hf_model, ids) <= TOL  # type: ignore[attr-defined]
    try:
        wrong = architectures.load(saved[name], {**_config(saved[name]), **change})
    except ModelLoadError:
        return  # the weights no longer fit the changed config: also a difference
    assert _worst(wrong, hf_model, ids) > 1e-3


# --- MPNet -------------------------------------------------------------------------------------


def test_mpnet_buckets_match_transformers() -> None:
    """Every distance from -300 to 300: exact below 8, log-spaced to 128, capped beyond."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from attnviz.architectures.mpnet import MAX_DISTANCE, NUM_BUCKETS
    from attnviz.architectures.t5 import relative_position_bucket

    relative = torch.arange(-300, 301)[None, :] - torch.zeros(2, 1, dtype=torch.long)  # (2, 601)
    ours = relative_position_bucket(relative, True, NUM_BUCKETS, MAX_DISTANCE)
    assert torch.equal(ours, MPNetEncoder.relative_position_bucket(relative))
    # Every bucket is read but 16, which would be distance 0 among the keys after the query.
    assert set(ours.flatten().tolist()) == set(range(32)) - {16}


def test_mpnet_position_bias_matters(saved: dict[str, Path]) -> None:
    own, hf = _engines("mpnet", saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    model: Any = architectures.load(saved["mpnet"])
    assert _worst(model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    with torch.no_grad():
        model.relative_bias.weight.zero_()
    assert _worst(model, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


def test_mpnet_refuses_a_table_too_small_to_index(saved: dict[str, Path]) -> None:
    with pytest.raises(ModelLoadError, match="relative_attention_num_buckets=16"):
        architectures.load(saved["mpnet"], {**_config(saved["mpnet"]), "relative_attention_num_buckets": 16})


def test_cohere_rotates_interleaved_pairs(saved: dict[str, Path]) -> None:
    """Llama's rotation of the halves (i, i + D/2) in place of Cohere's pairs (2i, 2i + 1) disagrees."""
    from attnviz.architectures.llama import LlamaDecoder

    own, hf = _engines("cohere", saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    model: Any = architectures.load(saved["cohere"])
    assert _worst(model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    model.qk_transforms = lambda input_ids, x: LlamaDecoder.qk_transforms(model, input_ids, x)
    assert _worst(model, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


def test_smollm3_nope_layers_see_no_positions(saved: dict[str, Path]) -> None:
    own, _ = _engines("smollm3", saved)
    model: Any = own.model
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    x = model.embed(ids)
    assert [qk is None for qk in model.qk_transforms(ids, x)] == [False, True, False]
    assert list(model.windows) == [None, 4, None]


def test_qwen2_moe_shared_expert_matters(saved: dict[str, Path]) -> None:
    """Without the gated shared expert (the routed experts alone, as in moe.py) the numbers disagree."""
    own, hf = _engines("qwen2_moe", saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    model: Any = architectures.load(saved["qwen2_moe"])
    assert _worst(model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    assert list(model.windows) == [4, None, 4] and model.config.sparse_layers == (0, 2)
    for layer in model.config.sparse_layers:
        model.blocks[layer].mlp = model.blocks[layer].mlp.routed
    assert _worst(model, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


# --- Marian and Pegasus: every part ---------------------------------------------------------

# (source, target): lengths differ, so a transposed cross-attention cannot pass.
PAIRS = ((SENTENCES[0], "the cat sat on the mat"), (SENTENCES[2], SENTENCES[1]))


@pytest.mark.parametrize("spec", SEQ2SEQ, ids=lambda s: s.name)
def test_every_part_matches_transformers(spec: Any, saved: dict[str, Path]) -> None:
    """Encoder self-attention, decoder self-attention and cross-attention, and both stacks'
    final hidden states; then the encoder through the row path (fused, every row and asked rows)."""
    own, hf = _engines(spec.name, saved)
    assert own.parts == hf.parts == ("encoder", "decoder", "cross")
    for part in own.parts:
        assert own.part_shape(part) == hf.part_shape(part), part
    for source, target in PAIRS:
        tokens, target_tokens = own.tokenize(source), own.tokenize_target(target)
        assert hf.tokenize_target(target) == target_tokens
        ours, theirs = own.forward_seq2seq(tokens, target_tokens), hf.forward_seq2seq(tokens, target_tokens)
        for part in own.parts:
            a, b = ours.part(part), theirs.part(part)
            assert len(a.attentions) == len(b.attentions) == own.part_shape(part).num_layers
            for layer, (x, y) in enumerate(zip(a.attentions, b.attentions, strict=True)):
                assert _diff(x, y) <= TOL, f"{spec.name} {part} layer {layer}"
            assert _diff(a.hidden_states, b.hidden_states) <= TOL, f"{spec.name} {part} hidden"
        rows, asked = own.forward(tokens), own.forward(tokens, queries=(2,))
        for layer, y in enumerate(theirs.encoder.attentions):
            assert _diff(rows.attentions[layer], y) <= TOL and _diff(asked.attentions[layer], y[:, :, [2]]) <= TOL
        assert _diff(rows.hidden_states, theirs.encoder.hidden_states) <= TOL


@pytest.mark.parametrize("spec", SEQ2SEQ, ids=lambda s: s.name)
def test_padded_batches_on_both_sides_match_transformers(spec: Any, saved: dict[str, Path]) -> None:
    own, hf = _engines(spec.name, saved)
    (src, src_mask) = own._padded([own.tokenize(s) for s, _ in PAIRS])  # type: ignore[attr-defined]
    (tgt, tgt_mask) = own._padded([own.tokenize_target(t) for _, t in PAIRS])  # type: ignore[attr-defined]
    assert src_mask.min() == 0 and tgt_mask.min() == 0
    with torch.inference_mode():
        ours = own.model.forward_seq2seq(src, tgt, src_mask, tgt_mask)  # type: ignore[attr-defined]
        theirs = hf.model(  # type: ignore[attr-defined]
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
            assert _diff(x.transpose(1, 2)[real], y.transpose(1, 2)[real]) <= TOL
    assert _diff(ours.encoder.hidden_states[real_src], theirs.encoder_last_hidden_state[real_src]) <= TOL
    assert _diff(ours.decoder.hidden_states[real_tgt], theirs.last_hidden_state[real_tgt]) <= TOL


@pytest.mark.parametrize("dim", [48, 47, 512])
def test_sinusoidal_table_is_transformers_own(dim: int) -> None:
    """Bit for bit, odd widths included."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from attnviz.architectures.marian import sinusoidal_table

    theirs = MarianSinusoidalPositionalEmbedding(70, dim).create_weight()
    assert torch.equal(sinusoidal_table(70, dim), theirs)


def test_marian_and_pegasus_differ_where_declared(saved: dict[str, Path]) -> None:
    marian: Any = _engines("marian", saved)[0].model
    pegasus: Any = _engines("pegasus", saved)[0].model
    unshared: Any = _engines("marian-unshared", saved)[0].model
    assert marian.encoder.blocks[0].pre_norm is False and marian.encoder.final_norm is None
    assert pegasus.encoder.blocks[0].pre_norm is True and pegasus.decoder.final_norm is not None
    assert marian.embed_scale == pegasus.embed_scale == 48**0.5
    assert marian.decoder_tokens is None and unshared.decoder_tokens is not None
    assert not torch.equal(unshared.decoder_tokens.weight, unshared.tokens.weight)


def test_hf_engine_computes_marians_tables_but_refuses_a_missing_weight(saved: dict[str, Path], tmp_path: Path) -> None:
    """transformers 5 saves no sinusoidal table for Marian and computes it on load: not a
    missing weight. A weight really missing is still refused."""
    from safetensors.torch import load_file, save_file

    source = saved["marian"]
    tensors = load_file(str(source / "model.safetensors"))
    assert not any("embed_positions" in name for name in tensors)
    load_engine("hf", str(source), "cpu")  # refused before: "lacks ... embed_positions.weight"
    directory = tmp_path / "incomplete"
    directory.mkdir()
    for item in source.iterdir():
        if item.name != "model.safetensors":
            (directory / item.name).write_bytes(item.read_bytes())
    save_file({k: v for k, v in tensors.items() if "layers.0.fc1" not in k}, str(directory / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="fc1"):
        load_engine("hf", str(directory), "cpu")


def test_family_modules_declare_what_the_registry_maps_to_them() -> None:
    """The registry finds each new module from its own MODEL_TYPES (no central list)."""
    import importlib

    declared = {
        "olmo": ("olmo", "olmoe"),
        "camembert": ("camembert",),
        "mpnet": ("mpnet",),
        "stablelm": ("stablelm",),
        "granite": ("granite",),
        "cohere": ("cohere",),
        "starcoder2": ("starcoder2",),
        "smollm3": ("smollm3",),
        "qwen2_moe": ("qwen2_moe",),
        "marian": ("marian", "pegasus"),
    }
    for name, model_types in declared.items():
        module = importlib.import_module(f"attnviz.architectures.{name}")
        assert model_types == module.MODEL_TYPES
        for model_type in model_types:
            assert architectures.registry()[model_type] is module, model_type
    assert {spec.model_type for spec in SPECS_B} == {t for types in declared.values() for t in types}


@pytest.mark.parametrize("name", ["olmoe", "mpnet", "cohere", "smollm3"])
def test_cli_show_words_and_compare_run(name: str, saved: dict[str, Path]) -> None:
    """The views on top of the rows work for the new stacks: words (keys summed per word)
    sum to each row's total, and ``compare`` (heads ranked by one token's measures) runs."""
    from attnviz.cli import app

    path = str(saved[name])
    result = CliRunner().invoke(
        app, ["show", SENTENCES[0], "--model", path, "--token", "it", "--layer", "1", "--words", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = torch.tensor(json.loads(result.stdout)["weights"])
    assert torch.allclose(rows.sum(-1), torch.ones(()), atol=1e-4)
    result = CliRunner().invoke(app, ["compare", SENTENCES[0], "--model", path, "--token", "it", "--json"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", ["marian", "pegasus"])
def test_cli_show_cross_attention_runs(name: str, saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    args = ["show", SENTENCES[0], "--model", str(saved[name]), "--target-text", "the cat sat", "--part", "cross"]
    result = CliRunner().invoke(app, [*args, "--token", "cat", "--layer", "all", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["part"] == "cross" and len(data["key_tokens"]) == len(_engines(name, saved)[0].tokenize(SENTENCES[0]))
