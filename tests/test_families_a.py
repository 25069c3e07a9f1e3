"""Issue 23, first half: the hf engine's defects D1, D3, D4, and the own-engine stacks of
GPT-NeoX, GPT-Neo, OPT, GPT-J, Phi, BLOOM, Falcon (Falcon-RW's ALiBi too) and GPT-BigCode
against transformers (eager attention) on tiny checkpoints with every quirk switched on
(tests/builders/families_a.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnviz.engines import load_engine
from attnviz.errors import UsageError
from attnviz.measures import metrics
from attnviz.measures.check import compare_engines

from .builders import SENTENCES, SPECS, SPECS_BY_NAME, Spec, copy_with_config, save_tiny
from .builders.families_a import CAUSALITY_SPECS, FAMILY_A_SPECS
from .helpers import inspect

TOL = 1e-5
# One query's rows come from a one-row product, which a CPU may sum in another order than
# transformers' whole matrix: with gpt_bigcode-mha's unscaled scores (logits of tens) that
# is 1.3e-5 on an AVX-512 machine, 0 on others.
ROWS_TOL = 2e-5
ALL_SPECS: tuple[Spec, ...] = (*SPECS, *CAUSALITY_SPECS, *FAMILY_A_SPECS)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families_a")


def _saved(root: Path, spec: Spec) -> Path:
    directory = root / spec.name
    if not (directory / "config.json").is_file():
        save_tiny(spec, directory)
    return directory


# --- D1: causality from the model ---------------------------------------------------------


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.name)
def test_hf_engine_reads_causality_from_the_model(spec: Spec, root: Path) -> None:
    """Every family transformers builds tiny: the hf engine's causal flag is what the
    checkpoint is (a decoder saved from *ForCausalLM; an encoder, or an encoder-decoder's
    encoder, otherwise), read from the model, not from a list of model_types (which
    missed OLMoE and SmolLM3), and the weights agree: exactly 0 on every later key."""
    hf = load_engine("hf", str(_saved(root, spec)), "cpu")
    decoder = spec.head == "causal"
    assert hf.shape.causal is decoder
    out = hf.forward(hf.tokenize(SENTENCES[0]))
    later = torch.ones(out.attentions[0].shape[-2:], dtype=torch.bool).triu(1)  # (Q, S)
    assert all(bool((a[..., later] == 0).all()) is decoder for a in out.attentions)


@pytest.mark.parametrize("name", ["olmoe", "smollm3"])
def test_compare_entropy_and_show_marks_follow_the_models_causality(name: str, root: Path) -> None:
    """The two families the list missed: entropy normalised over the i + 1 tokens query i
    sees (a decoder row), and show's title marks the masked later tokens."""
    from attnviz.cli import app

    spec = next(s for s in CAUSALITY_SPECS if s.name == name)
    directory = _saved(root, spec)
    engine = load_engine("hf", str(directory), "cpu")
    query = 3
    att = inspect(SENTENCES[0], engine, layers="all", queries=[query])
    assert att.provenance.causal
    rows = np.asarray(att.weights[:, :, 0, : query + 1], dtype=np.float64)  # (N, H, q + 1): what q sees
    by_hand = -(rows * np.log(rows)).sum(-1) / np.log(query + 1)  # (N, H)
    stats = metrics.head_stats(att, query)
    assert [s.entropy for s in stats] == pytest.approx(by_hand.reshape(-1).tolist(), abs=1e-6)
    token = att.tokens.labels[query]
    result = CliRunner().invoke(
        app, ["show", SENTENCES[0], "--model", str(directory), "--engine", "hf", "--token", token, "--layer", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "causal: later tokens" in result.stdout


# --- D3, D4: dynamic RoPE in the hf engine and in check -----------------------------------


@pytest.fixture(scope="module")
def dynamic(root: Path) -> Path:
    """The dynamic-RoPE Llama with max_position_embeddings 6: every test sentence runs past it."""
    return copy_with_config(
        _saved(root, SPECS_BY_NAME["llama-rope-dynamic"]), root / "dynamic-6", max_position_embeddings=6
    )


def test_hf_engine_runs_dynamic_rope_past_max_position_embeddings(dynamic: Path, root: Path) -> None:
    own, hf = load_engine("own", str(dynamic), "cpu"), load_engine("hf", str(dynamic), "cpu")
    assert own.max_positions is None and hf.max_positions is None
    tokens = hf.tokenize(SENTENCES[0])
    assert len(tokens) > 6
    ours, theirs = own.forward(tokens), hf.forward(tokens)
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):
        assert float((a - b).abs().max()) <= TOL
    # Plain RoPE keeps its limit, in both engines.
    plain = copy_with_config(_saved(root, SPECS_BY_NAME["llama"]), root / "plain-6", max_position_embeddings=6)
    for name in ("own", "hf"):
        with pytest.raises(UsageError):
            load_engine(name, str(plain), "cpu").tokenize(SENTENCES[0])


def test_hf_engine_forgets_the_grown_rotary_state_between_passes(dynamic: Path) -> None:
    """transformers keeps dynamic RoPE's θ grown for the longest input so far; the hf
    engine gives each pass a fresh model's state, so a sentence's weights do not depend
    on what ran before it."""
    hf = load_engine("hf", str(dynamic), "cpu")
    short, long = hf.tokenize("the cat sat on the mat"), hf.tokenize(SENTENCES[1])
    assert 6 < len(short) < len(long)
    first = hf.forward(short).attentions
    hf.forward(long)
    again = hf.forward(short).attentions
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_hf_ablation_passes_forget_the_grown_rotary_state(dynamic: Path) -> None:
    """The passes ablation runs (``final_hidden``) start from a fresh model's rotary state
    too, so a head's ablation effect does not depend on a longer text run before it."""
    from attnviz.measures.ablation import Ablation, Runner

    hf = load_engine("hf", str(dynamic), "cpu")
    short, long = hf.tokenize("the cat sat on the mat"), hf.tokenize(SENTENCES[1])
    assert 6 < len(short) < len(long)
    runner = Runner(hf, short)
    ablate = (0, Ablation(heads=(0, 1)))
    first, first_ablated = runner.hidden(), runner.hidden(ablate)
    hf.forward(long)
    assert torch.equal(runner.hidden(), first)
    hf.forward(long)
    assert torch.equal(runner.hidden(ablate), first_ablated)


def test_check_with_sentences_of_different_lengths_on_dynamic_rope(dynamic: Path) -> None:
    """Longer, then shorter sentences (all past max_position_embeddings): each is compared
    with a freshly reset transformers model."""
    from attnviz.cli import app

    sentences = [SENTENCES[1], SENTENCES[0], "the cat sat on the mat"]
    assert compare_engines(str(dynamic), sentences, device="cpu").passed
    args = ["check", "--model", str(dynamic), "--device", "cpu", "--json"]
    for sentence in sentences:
        args += ["--sentence", sentence]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["passed"] is True


# --- the own-engine stacks ------------------------------------------------------------------


@pytest.fixture(scope="module")
def families(root: Path) -> dict[str, Path]:
    return {spec.name: _saved(root, spec) for spec in FAMILY_A_SPECS}


def _hf_model(path: Path) -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"{tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.double() - b.double()).abs().max())


@pytest.mark.parametrize("spec", FAMILY_A_SPECS, ids=lambda s: s.name)
def test_family_equals_transformers_on_every_path(spec: Spec, families: dict[str, Path]) -> None:
    """Against transformers itself (eager attention, loaded here): the rows ``show`` computes
    (fused output, exact rows of one query), the full matrices ``check`` compares, the
    eager reference, and the final hidden states, all within 1e-5 in float32."""
    path = families[spec.name]
    own = load_engine("own", str(path), "cpu")
    model: Any = own.model
    hf = _hf_model(path)
    assert own.files.model_type == spec.model_type and own.shape.causal
    for sentence in SENTENCES:
        tokens = own.tokenize(sentence)
        ids = torch.tensor([tokens.ids])  # (1, S)
        with torch.inference_mode():
            theirs = hf(input_ids=ids, output_attentions=True)
            eager = model(ids, fused=False)
        full = own.forward(tokens)
        query = len(tokens) // 2
        rows = inspect(tokens, own, layers="all", queries=[query]).weights  # (N, H, 1, S), show's path
        for layer, reference in enumerate(theirs.attentions):
            assert _diff(eager.attentions[layer], reference) <= TOL, (spec.name, layer, "eager")
            assert _diff(full.attentions[layer], reference) <= TOL, (spec.name, layer, "full")
            one = _diff(torch.from_numpy(rows[layer, :, 0]), reference[0, :, query])
            assert one <= ROWS_TOL, (spec.name, layer)
        assert _diff(eager.hidden_states, theirs.last_hidden_state) <= TOL
        assert _diff(full.hidden_states, theirs.last_hidden_state) <= TOL


@pytest.mark.parametrize("spec", FAMILY_A_SPECS, ids=lambda s: s.name)
def test_family_padded_batch_equals_transformers(spec: Spec, families: dict[str, Path]) -> None:
    """Sentences of different lengths right-padded into one batch, both engines' batch path."""
    path = families[spec.name]
    own, hf = load_engine("own", str(path), "cpu"), load_engine("hf", str(path), "cpu")
    batch = [own.tokenize(s) for s in SENTENCES]
    assert len({len(t) for t in batch}) > 1
    ours, theirs = own.forward_batch(batch), hf.forward_batch(batch)
    real = torch.zeros(len(batch), max(len(t) for t in batch), dtype=torch.bool)
    for b, tokens in enumerate(batch):
        real[b, : len(tokens)] = True
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):
        assert _diff(a.transpose(1, 2)[real], b.transpose(1, 2)[real]) <= TOL  # rows of real queries
    assert _diff(ours.hidden_states[real], theirs.hidden_states[real]) <= TOL


@pytest.mark.parametrize("spec", FAMILY_A_SPECS, ids=lambda s: s.name)
def test_family_cli_check_and_show(spec: Spec, families: dict[str, Path]) -> None:
    from attnviz.cli import app

    path = str(families[spec.name])
    result = CliRunner().invoke(app, ["check", "--model", path, "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] is True and data["model_type"] == spec.model_type and data["worst"] <= TOL
    shown = {}
    for engine in ("own", "hf"):
        args = ["show", SENTENCES[0], "--model", path, "--engine", engine, "--token", "street", "--json"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        shown[engine] = np.asarray(json.loads(result.stdout)["weights"])
        assert json.loads(result.stdout)["provenance"]["causal"] is True
    assert float(np.abs(shown["own"] - shown["hf"]).max()) <= TOL + 1e-6  # JSON keeps 6 decimals


def test_registry_finds_the_new_families() -> None:
    from attnviz import architectures

    registry = architectures.registry()
    for spec in FAMILY_A_SPECS:
        module = registry[spec.model_type]
        assert module.__name__.rsplit(".", 1)[-1] == spec.model_type.replace("-", "_")


def _worst_against(model: Any, hf: Any, path: Path) -> float:
    from transformers import AutoTokenizer

    ids = torch.tensor([AutoTokenizer.from_pretrained(str(path))(SENTENCES[0])["input_ids"]])  # (1, S)
    with torch.inference_mode():
        ours, theirs = model(ids, fused=False), hf(input_ids=ids, output_attentions=True)
    diffs = [_diff(a, b) for a, b in zip(ours.attentions, theirs.attentions, strict=True)]
    return max(*diffs, _diff(ours.hidden_states, theirs.last_hidden_state))


# Each quirk, switched off in our reading of the config only: the result must then move
# away from transformers', so the tiny checkpoints really exercise it.
QUIRKS = [
    ("gpt_neox", {"use_parallel_residual": False}),
    ("gpt_neox", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}}),
    ("gpt_neox-sequential", {"use_parallel_residual": True}),
    ("gpt_neo", {"window_size": 256}),
    ("gpt_neo", {"attention_layers": ["global"] * 3}),
    ("opt-postnorm", {"do_layer_norm_before": True, "_remove_final_layer_norm": True}),
    ("gptj", {"rotary_dim": 16}),
    ("phi", {"qk_layernorm": False}),
    ("phi-plain", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    ("bloom", {"apply_residual_connection_post_layernorm": True}),
    ("falcon-new", {"num_ln_in_parallel_attn": 1}),
    ("falcon-sequential", {"parallel_attn": True}),
    ("falcon-rw", {"alibi": False}),
    ("falcon-alibi-new", {"alibi": False}),
    ("gpt_bigcode-mha", {"scale_attn_weights": True}),
]


@pytest.mark.parametrize(("name", "change"), QUIRKS, ids=lambda x: x if isinstance(x, str) else "-".join(x))
def test_each_quirk_matters(name: str, change: dict[str, Any], families: dict[str, Path]) -> None:
    from attnviz import architectures

    path = families[name]
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    hf = _hf_model(path)
    assert _worst_against(architectures.load(path), hf, path) <= TOL
    assert _worst_against(architectures.load(path, {**config, **change}), hf, path) > 1e-3


def test_gpt_neo_reads_older_attention_types_and_masks_its_local_window(families: dict[str, Path]) -> None:
    from attnviz import architectures

    path = families["gpt_neo"]
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    assert config["attention_layers"] == ["local", "global", "local"]
    old: Any = architectures.load(path, {k: v for k, v in config.items() if k != "attention_layers"})
    assert list(old.windows) == [3, None, 3]
    own = load_engine("own", str(path), "cpu")
    out = own.forward(own.tokenize(SENTENCES[0]))
    far = torch.ones(out.attentions[0].shape[-2:], dtype=torch.bool).tril(-3)  # (Q, S): j <= i - 3
    assert [bool((a[..., far] == 0).all()) for a in out.attentions] == [True, False, True]


def test_opt_reads_positions_at_an_offset_of_two(families: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from attnviz import architectures
    from attnviz.architectures import opt

    path = families["opt"]
    hf = _hf_model(path)
    model: Any = architectures.load(path)
    assert model.positions.num_embeddings == 64 + 2 and model.project_in.in_features == 20
    assert _worst_against(model, hf, path) <= TOL
    monkeypatch.setattr(opt, "POSITION_OFFSET", 0)
    assert _worst_against(model, hf, path) > 1e-3


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 6, 8, 12, 16, 20, 112])
def test_alibi_slopes_equal_transformers(heads: int) -> None:
    """Powers of two and not (the extra slopes), up to BLOOM-176B's 112 heads; bit for bit."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    from attnviz.architectures.alibi import alibi_slopes

    assert torch.equal(alibi_slopes(heads), _get_alibi_slopes(heads, torch.device("cpu")))
    if heads == 8:  # the paper's example: 1/2, 1/4, ..., 1/256
        assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]


FALCON_ALIBI = ["falcon-rw", "falcon-alibi-7b", "falcon-alibi-new"]


@pytest.mark.parametrize("name", FALCON_ALIBI)
def test_falcon_alibi_eager_equals_sdpa_in_transformers(name: str, families: dict[str, Path]) -> None:
    """Why ALiBi Falcon is no longer refused: transformers' eager path now adds the bias
    once, through the float mask, as its SDPA path does (before 5.25 eager added it twice,
    0.06 apart in the hidden states). Measured: 1.2e-6 to 1.8e-6 apart (float32)."""
    from transformers import FalconModel

    path = families[name]
    eager, sdpa = (FalconModel.from_pretrained(str(path), attn_implementation=i).eval() for i in ("eager", "sdpa"))
    ids = torch.tensor([[3, 8, 5, 9, 4, 7, 6, 11, 2, 10]])
    with torch.inference_mode():
        assert _diff(eager(ids).last_hidden_state, sdpa(ids).last_hidden_state) <= TOL


def test_falcon_alibi_rounds_its_bias_in_bfloat16(families: dict[str, Path]) -> None:
    """transformers multiplies bfloat16 slopes by the positions: with Falcon-RW's 12 heads
    four slopes are odd powers of √2, which bfloat16 rounds, and float32 slopes would move
    the weights by 2.6e-3 (measured) away from transformers'."""
    from attnviz import architectures

    path = families["falcon-rw"]
    hf = _hf_model(path)
    model: Any = architectures.load(path)
    assert _worst_against(model, hf, path) <= TOL
    for block in model.blocks:
        block.attn.slope_dtype = torch.float32
    assert _worst_against(model, hf, path) > 1e-3


def test_hf_engine_refuses_alibi_falcon_where_eager_adds_the_bias_twice(
    families: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers 5.0 to 5.24's FalconAttention takes ``alibi`` and adds it to scores whose
    mask already holds it; the hf engine reads that from the code and refuses."""
    from attnviz.cli import hint_for
    from attnviz.engines import hf_model
    from attnviz.errors import EngineError

    model = _hf_model(families["falcon-rw"])
    assert not hf_model.adds_alibi_twice(model)  # this transformers: the mask alone carries it

    class FalconAttention(torch.nn.Module):  # the signature of transformers before 5.25
        def forward(self, hidden_states: torch.Tensor, alibi: torch.Tensor | None) -> None: ...

    model.h[0].self_attention = FalconAttention()
    assert hf_model.adds_alibi_twice(model)
    model.config.alibi = False
    assert not hf_model.adds_alibi_twice(model)
    monkeypatch.setattr(hf_model, "adds_alibi_twice", lambda model: True)
    with pytest.raises(EngineError) as info:
        load_engine("hf", str(families["falcon-rw"]), "cpu")
    assert "twice" in str(info.value) and "5.25" in (hint_for(info.value) or "")


@pytest.mark.parametrize("name", ["phi", "falcon-sequential", "falcon-rw"])
def test_dynamic_rope_families_run_past_max_position_embeddings(
    name: str, families: dict[str, Path], root: Path
) -> None:
    """The new families with dynamic RoPE, as D3/D4 for Llama, and ALiBi Falcon (no
    position table): both engines read past max_position_embeddings (6 here), and agree
    sentence after sentence."""
    path = copy_with_config(families[name], root / f"{name}-dynamic-6", max_position_embeddings=6)
    own, hf = load_engine("own", str(path), "cpu"), load_engine("hf", str(path), "cpu")
    assert own.max_positions is None and hf.max_positions is None
    for sentence in SENTENCES:  # 14, 12, then 7 tokens: the longest first
        tokens = own.tokenize(sentence)
        assert len(tokens) > 6
        ours, theirs = own.forward(tokens), hf.forward(tokens)
        for a, b in zip(ours.attentions, theirs.attentions, strict=True):
            assert _diff(a, b) <= TOL
        assert _diff(ours.hidden_states, theirs.hidden_states) <= TOL
