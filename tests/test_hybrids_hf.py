"""Issue 37, the hf engine's part: hybrids named by their true model layers, T5Gemma as the
encoder-decoder it is, refusals in one line before any crash, and hints that never send a
user to an engine that refuses too.

The reference for a hybrid's layer numbers is each config's own description of its
layers (tests/builders/hybrids.py's ATTENTION_LAYERS, written from the configs' arguments);
the reference for its weights is transformers' eager model called directly.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from attnviz.engines import load_engine
from attnviz.errors import LayerError, UnsupportedArchitectureError
from attnviz.select import parse_layers
from attnviz.shape import ModelShape

from .builders import SENTENCES, VOCAB_SIZE, Spec, _config, build_tokenizer, save_tiny
from .builders.hybrids import ATTENTION_LAYERS, HYBRID_SPECS, HYBRID_SPECS_BY_NAME
from .helpers import one_error_line

TOL = 1e-5


class _Saved(dict[str, Path]):
    def __init__(self, root: Path, specs: dict[str, Spec]) -> None:
        super().__init__()
        self.root, self.specs = root, specs

    def __missing__(self, name: str) -> Path:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self[name] = path = save_tiny(self.specs[name], self.root / name)
        return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Saved(tmp_path_factory.mktemp("hybrids"), {**HYBRID_SPECS_BY_NAME, **OTHER_SPECS})


def _cli(*args: str) -> Any:
    from attnviz.cli import app

    return CliRunner().invoke(app, list(args))


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"{tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.double() - b.double()).abs().max())


# --- the layer numbers of a hybrid ---------------------------------------------------------


@pytest.mark.parametrize("spec", HYBRID_SPECS, ids=lambda s: s.name)
def test_hf_engine_numbers_a_hybrid_by_its_true_layers(spec: Spec, saved: dict[str, Path]) -> None:
    """The engine's attention layers are the config's, and layer N's weights are those
    transformers computes in model layer N (eager, called directly)."""
    from transformers import AutoModel

    engine = load_engine("hf", str(saved[spec.name]), "cpu")
    expected = ATTENTION_LAYERS[spec.name]
    assert engine.shape.layers == expected
    assert engine.shape.hybrid is (len(expected) < engine.num_layers)
    reference = AutoModel.from_pretrained(str(saved[spec.name]), attn_implementation="eager").eval()
    tokens = engine.tokenize(SENTENCES[0])
    ids = torch.tensor([tokens.ids])
    with torch.inference_mode():
        theirs = reference(input_ids=ids, output_attentions=True).attentions
    assert len(theirs) == len(expected)
    everything = engine.forward(tokens)  # no layers asked: every attention layer, no IndexError
    assert len(everything.attentions) == len(expected)
    for layer, weights in zip(expected, theirs, strict=True):
        one = engine.forward(tokens, layers=(layer,), queries=(1, len(tokens) - 1))
        assert _diff(one.attentions[0], weights[:, :, [1, len(tokens) - 1]]) <= TOL, f"{spec.name} layer {layer}"
        assert _diff(everything.attentions[expected.index(layer)], weights) <= TOL


@pytest.mark.parametrize("name", ["qwen3_next", "jamba", "lfm2"])
def test_show_names_a_hybrids_attention_layers(name: str, saved: dict[str, Path]) -> None:
    path = str(saved[name])
    shown = _cli("show", SENTENCES[0], "--model", path, "--engine", "hf", "--token", "it", "--json")
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["layers"] == list(ATTENTION_LAYERS[name])
    assert data["provenance"]["attention_layers"] == list(ATTENTION_LAYERS[name])
    no_attention = next(n for n in range(4) if n not in ATTENTION_LAYERS[name])
    args = ["show", SENTENCES[0], "--model", path, "--engine", "hf", "--token", "it", "--layer", str(no_attention)]
    line = one_error_line(_cli(*args), 2)
    assert f"layer {no_attention} has no softmax attention" in line
    assert ", ".join(map(str, ATTENTION_LAYERS[name])) in line


@pytest.mark.parametrize("name", ["qwen3_next", "jamba", "lfm2"])
def test_hf_generation_labels_a_hybrids_rows_by_true_layer(name: str, saved: dict[str, Path]) -> None:
    """transformers' generate returns one tensor per attention layer: each written token's
    rows of model layer N are those a full pass over prompt + continuation gives layer N
    (they were indexed by slot: an IndexError, or another layer's rows under N's label)."""
    from attnviz.generation import extend_tokens, generate

    engine = load_engine("hf", str(saved[name]), "cpu")
    layers = ATTENTION_LAYERS[name]
    tokens = engine.tokenize(SENTENCES[0])
    for asked in (layers, layers[-1:]):
        got = generate(engine, tokens, 3, layers=asked)
        assert len(got.rows) == len(got.ids) > 0
        full = engine.forward(extend_tokens(engine.tokenizer, tokens, got.ids), layers=asked)
        prompt = len(tokens.ids) - 1
        expected = torch.stack([w[0, :, prompt, : prompt + 1] for w in full.attentions])
        assert _diff(torch.as_tensor(got.first_rows), expected) <= TOL
        for i, position in enumerate(got.positions):
            expected = torch.stack([w[0, :, position, : position + 1] for w in full.attentions])
            assert _diff(torch.as_tensor(got.rows[i]), expected) <= TOL, f"{name} {asked} step {i}"


def test_a_hybrid_text_view_labels_the_true_layer(saved: dict[str, Path]) -> None:
    path = str(saved["jamba"])
    shown = _cli("show", SENTENCES[0], "--model", path, "--engine", "hf", "--token", "it", "--layer", "3")
    assert shown.exit_code == 0, shown.output
    assert re.search(r"\blayer 3\b", shown.stdout) and not re.search(r"\blayer 1\b", shown.stdout)


def test_a_hybrids_heads_ablate_under_hf(saved: dict[str, Path]) -> None:
    """Qwen3-Next's gated attention: removing a head of layer 3 through its W^O changes
    the output, and the layers without attention are left out of the effects."""
    from attnviz.measures.ablation import Ablation, Runner
    from attnviz.nn.taps import Taps

    engine = load_engine("hf", str(saved["qwen3_next"]), "cpu")
    tokens = engine.tokenize(SENTENCES[0])
    runner = Runner(engine, tokens)
    clean = runner.hidden()
    removed = runner.hidden((3, Ablation((0, 2))))
    assert removed.shape[0] == 2 and _diff(removed[0], clean[0]) > 1e-4
    taps = Taps().record("blocks.*.attn.z")  # each head's output: W^O's input, where there is one
    with engine.tapping(taps):
        engine.final_hidden(tokens)
    assert [f"blocks.{n}.attn.z" in taps for n in range(4)] == [n in (1, 3) for n in range(4)]


def test_parse_layers_of_a_hybrid() -> None:
    shape = ModelShape(8, 4, 2, True, attention_layers=(3, 7))
    assert parse_layers(None, 8, shape.attention_layers) == (3, 7)
    assert parse_layers("0-5", 8, shape.attention_layers) == (3,)
    assert parse_layers("-1", 8, shape.attention_layers) == (7,)
    with pytest.raises(LayerError, match="layer 0 has no softmax attention: only layers 3, 7"):
        parse_layers("0", 8, shape.attention_layers)
    with pytest.raises(LayerError, match="layers 0-2 have no softmax attention"):
        parse_layers("0-2", 8, shape.attention_layers)
    with pytest.raises(LayerError, match="out of range"):
        parse_layers("8", 8, shape.attention_layers)
    with pytest.raises(ValueError, match="ascend"):
        ModelShape(8, 4, 2, True, attention_layers=(7, 3))


def test_rollout_on_a_hybrid_is_refused_in_one_line(saved: dict[str, Path]) -> None:
    args = ["show", SENTENCES[0], "--model", str(saved["jamba"]), "--engine", "hf", "--token", "it", "--rollout"]
    assert "hybrid model's layers 0, 2 have none" in one_error_line(_cli(*args), 2)


# --- other families the hf engine mishandled ---------------------------------------------------

_B = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=24,
    max_position_embeddings=64,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def _t5gemma() -> Any:
    import transformers

    stack = dict(_B, num_hidden_layers=2, head_dim=8)
    encoder = transformers.T5GemmaModuleConfig(**stack)
    decoder = transformers.T5GemmaModuleConfig(**{**stack, "num_hidden_layers": 3, "num_attention_heads": 2})
    return transformers.T5GemmaConfig(
        encoder=encoder, decoder=decoder, vocab_size=VOCAB_SIZE, pad_token_id=0, bos_token_id=1, eos_token_id=2
    )


OTHER_SPECS: dict[str, Spec] = {
    "t5gemma": Spec("t5gemma", "t5gemma", _t5gemma, "seq2seq", "t5"),
    "longt5": Spec(
        "longt5",
        "longt5",
        _config(
            "LongT5Config",
            vocab_size=VOCAB_SIZE,
            d_model=32,
            d_kv=8,
            d_ff=24,
            num_layers=2,
            num_heads=4,
            encoder_attention_type="transient-global",
            decoder_start_token_id=0,
        ),
        "seq2seq",
        "t5",
    ),
    "minimax": Spec(
        "minimax",
        "minimax",
        _config(
            "MiniMaxConfig",
            **_B,
            num_hidden_layers=2,
            head_dim=8,
            num_local_experts=2,
            num_experts_per_tok=1,
            layer_types=["linear_attention", "full_attention"],
            block_size=4,
        ),
        "causal",
        "llama",
    ),
    "gemma3n": Spec(
        "gemma3n",
        "gemma3n_text",
        _config(
            "Gemma3nTextConfig",
            **{**_B, "intermediate_size": [24, 20, 24, 20]},
            num_hidden_layers=4,
            head_dim=8,
            num_kv_shared_layers=2,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=VOCAB_SIZE,
            laurel_rank=4,
            altup_num_inputs=2,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            sliding_window=4,
            activation_sparsity_pattern=[0.0] * 4,
        ),
        "causal",
        "llama",
    ),
    "phi3-odd-rotary": Spec(
        "phi3-odd-rotary",
        "phi3",
        _config(
            "Phi3Config",
            **{**_B, "hidden_size": 40},  # head_dim 10, 0.75 of it: a rotary width of 7
            num_hidden_layers=2,
            partial_rotary_factor=0.75,
        ),
        "causal",
        "llama",
        perturb=True,
    ),
}


def test_t5gemma_runs_under_hf_as_an_encoder_decoder(saved: dict[str, Path]) -> None:
    from transformers import AutoModel

    engine = load_engine("hf", str(saved["t5gemma"]), "cpu")
    assert engine.parts and not engine.causal
    assert (engine.num_layers, engine.num_heads) == (2, 4)
    assert engine.decoder_shape is not None
    assert (engine.decoder_shape.num_layers, engine.decoder_shape.num_heads) == (3, 2)
    tokens, target = engine.tokenize(SENTENCES[0]), engine.tokenize_target("the cat sat")
    out = engine.forward_seq2seq(tokens, target)
    reference = AutoModel.from_pretrained(str(saved["t5gemma"]), attn_implementation="eager").eval()
    with torch.inference_mode():
        theirs = reference(
            input_ids=torch.tensor([tokens.ids]),
            decoder_input_ids=torch.tensor([target.ids]),
            output_attentions=True,
        )
    for ours, ref in ((out.encoder.attentions, theirs.encoder_attentions), (out.cross, theirs.cross_attentions)):
        assert len(ours) == len(ref)
        assert max(_diff(a, b) for a, b in zip(ours, ref, strict=True)) <= TOL
    shown = _cli(
        "show", "the cat sat", "--model", str(saved["t5gemma"]), "--engine", "hf", "--part", "cross",
        "--target-text", "the dog", "--token", "dog", "--json",
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output


@pytest.mark.parametrize("name", ["longt5", "minimax"])
@pytest.mark.parametrize("engine", ["own", "hf"])
def test_block_sparse_and_state_attention_are_refused_in_one_line(
    name: str, engine: str, saved: dict[str, Path]
) -> None:
    args = ["show", SENTENCES[0], "--model", str(saved[name]), "--engine", engine, "--token", "it"]
    line = one_error_line(_cli(*args), 2)
    assert ("per-block weights" if name == "longt5" else "running key-value state") in line
    assert "--engine" not in line


def test_the_probe_refuses_attention_that_is_not_token_by_token(saved: dict[str, Path]) -> None:
    """Past the table: the probe itself refuses returned weights of another shape."""
    from transformers import AutoModel

    from attnviz.engines.hf_taps import probe

    model = AutoModel.from_pretrained(str(saved["longt5"]), attn_implementation="eager").eval()
    with pytest.raises(UnsupportedArchitectureError, match="block-sparse attention or a recurrent state"):
        probe(model.get_encoder(), torch.device("cpu"))


@pytest.mark.parametrize("engine_name", ["own", "hf"])
def test_text_only_gemma3n_is_accepted_and_runs(engine_name: str, saved: dict[str, Path]) -> None:
    """Its per-layer ``intermediate_size`` list loads under both engines (tests/test_families_2026.py
    holds the own engine's Gemma 3n to transformers with every quirk on)."""
    from transformers import AutoModel

    path = saved["gemma3n"]
    assert json.loads((path / "config.json").read_text())["intermediate_size"] == [24, 20, 24, 20]
    engine = load_engine(engine_name, str(path), "cpu")
    tokens = engine.tokenize(SENTENCES[0])
    reference = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.inference_mode():
        theirs = reference(input_ids=torch.tensor([tokens.ids]), output_attentions=True)
    ours = engine.forward(tokens)
    assert len(ours.attentions) == len(theirs.attentions) == 4
    assert max(_diff(a, b) for a, b in zip(ours.attentions, theirs.attentions, strict=True)) <= TOL
    assert _diff(ours.hidden_states, theirs.last_hidden_state) <= TOL


def test_a_per_layer_size_list_is_still_checked() -> None:
    from attnviz.errors import ModelLoadError
    from attnviz.io.checkpoint import validate_config

    validate_config({"num_hidden_layers": 2, "intermediate_size": [8, 16]})
    with pytest.raises(ModelLoadError, match="lists 3 sizes for 2 layers"):
        validate_config({"num_hidden_layers": 2, "intermediate_size": [8, 16, 8]})
    with pytest.raises(ModelLoadError, match="one per layer"):
        validate_config({"num_hidden_layers": 2, "intermediate_size": [8, 0]})


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_phi3_with_an_odd_rotary_width_runs_as_transformers_runs_it(engine: str, saved: dict[str, Path]) -> None:
    from transformers import AutoModel

    path = saved["phi3-odd-rotary"]
    loaded = load_engine(engine, str(path), "cpu")
    reference = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    for sentence in SENTENCES:
        tokens = loaded.tokenize(sentence)
        with torch.inference_mode():
            theirs = reference(input_ids=torch.tensor([tokens.ids]), output_attentions=True)
        ours = loaded.forward(tokens)
        assert max(_diff(a, b) for a, b in zip(ours.attentions, theirs.attentions, strict=True)) <= TOL
        assert _diff(ours.hidden_states, theirs.last_hidden_state) <= TOL
    if engine == "own":
        checked = _cli("check", "--model", str(path), "--json")
        assert checked.exit_code == 0 and json.loads(checked.stdout)["passed"] is True, checked.output


# --- models that read no text, and every hint followed -----------------------------------------


def _save_base(config: Any, directory: Path) -> Path:
    """transformers' base model of ``config`` (audio models have no text task head) with a
    word-level tokenizer beside it, so that only the model's input kind can refuse it."""
    from transformers import AutoModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoModel.from_config(config).save_pretrained(directory)
    build_tokenizer("t5").save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import transformers

    root = tmp_path_factory.mktemp("audio")
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    small = dict(vocab_size=VOCAB_SIZE, max_target_positions=32, max_source_positions=32, **ids)
    whisper = transformers.WhisperConfig(
        **small, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=24, decoder_ffn_dim=24, num_mel_bins=8,
    )  # fmt: skip
    moonshine = transformers.MoonshineConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=24, encoder_num_hidden_layers=1,
        decoder_num_hidden_layers=1, encoder_num_attention_heads=4, decoder_num_attention_heads=4, **ids,
    )  # fmt: skip
    return {"whisper": _save_base(whisper, root / "whisper"), "moonshine": _save_base(moonshine, root / "moonshine")}


@pytest.mark.parametrize("name", ["whisper", "moonshine"])
@pytest.mark.parametrize("engine", ["own", "hf"])
def test_audio_models_are_refused_up_front_under_both_engines(name: str, engine: str, audio: dict[str, Path]) -> None:
    line = one_error_line(_cli("show", "the cat", "--model", str(audio[name]), "--engine", engine, "--token", "cat"), 2)
    assert f"{name!r} models read audio" in line and "not text" in line
    assert "--engine" not in line


def _hinted_engine(line: str) -> str | None:
    match = re.search(r"use --engine (own|hf)\b", line)
    return match[1] if match else None


def _follow(args: list[str], engine: str) -> list[str]:
    """Run ``args`` under ``engine``; while the refusal's hint names another engine, run
    that. Returns the lines seen; the walk must end in a run (exit 0) or a refusal that
    names no engine, and never come back to an engine already tried."""
    tried, lines = [engine], []
    while True:
        result = _cli(*args, "--engine", engine)
        if result.exit_code == 0:
            return lines
        line = one_error_line(result, result.exit_code)
        lines.append(line)
        hinted = _hinted_engine(line)
        if hinted is None:
            return lines
        assert hinted not in tried, f"the hint sends {args} back to --engine {hinted}: {lines}"
        tried.append(hinted)
        engine = hinted


def _deepseek_v3(directory: Path) -> Path:
    spec = Spec(
        "deepseek_v3",
        "deepseek_v3",
        _config(
            "DeepseekV3Config",
            **{**_B, "num_key_value_heads": 4},
            num_hidden_layers=2,
            q_lora_rank=16,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=6,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            moe_intermediate_size=8,
            first_k_dense_replace=1,
        ),
        "causal",
        "llama",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return save_tiny(spec, directory)


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_every_refusal_hint_leads_somewhere_true(
    engine: str, saved: dict[str, Path], audio: dict[str, Path], tmp_path: Path
) -> None:
    """Each refusal's hint, followed: Whisper, Moonshine, LongT5, MiniMax; DeepSeek-V3
    with --measure norm; Qwen3-Next with --ablate and with a layer without attention."""
    deepseek = str(_deepseek_v3(tmp_path / "deepseek_v3"))
    cases = [
        ["show", "the cat", "--model", str(audio["whisper"]), "--token", "cat"],
        ["show", "the cat", "--model", str(audio["moonshine"]), "--token", "cat"],
        ["show", SENTENCES[0], "--model", str(saved["longt5"]), "--token", "it"],
        ["show", SENTENCES[0], "--model", str(saved["minimax"]), "--token", "it"],
        ["show", SENTENCES[0], "--model", deepseek, "--token", "it", "--measure", "norm"],
        ["show", SENTENCES[0], "--model", str(saved["qwen3_next"]), "--token", "it", "--ablate"],
        ["show", SENTENCES[0], "--model", str(saved["qwen3_next"]), "--token", "it", "--layer", "0"],
    ]
    for args in cases:
        for line in _follow(args, engine):
            assert "encoder attention" not in line, line  # a decoder's attention is self-attention


def test_the_corpus_scan_names_a_hybrids_true_layers(saved: dict[str, Path], tmp_path: Path) -> None:
    """``attnviz heads`` (one padded batch through forward_batch) ranks heads of layers 1
    and 3 of Jamba, named so, and refuses layer 0."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{SENTENCES[0]}\n{SENTENCES[1]}\n", encoding="utf-8")
    path = str(saved["jamba"])
    done = _cli("heads", str(corpus), "--model", path, "--engine", "hf", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["layers"] == [1, 3]
    line = one_error_line(_cli("heads", str(corpus), "--model", path, "--engine", "hf", "--layer", "0"), 2)
    assert "layer 0 has no softmax attention" in line
