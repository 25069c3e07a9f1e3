"""Issue 10's decoder parts, beyond the family-by-family comparison of test_architectures.py
(which runs every tiny checkpoint of tests/builders/ against transformers):

* scaled RoPE: our inverse frequencies against transformers' own init functions, and
  dynamic NTK past max_position_embeddings against a freshly loaded transformers model;
* each quirk matters: switched off, the weights no longer match transformers;
* the fused expert layout loads like the per-expert one;
* learned attention sinks: rows sum to 1 - the sink's share, and the views say so;
* settings we do not implement are refused by name;
* ``attnviz check`` passes on every new family's tiny checkpoint.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from attnviz import architectures
from attnviz.architectures.rope import RopeConfig, rope_config
from attnviz.cli import hint_for
from attnviz.engines import Engine, load_engine
from attnviz.errors import ModelLoadError, UnsupportedArchitectureError
from attnviz.nn.attention import softmax_attention

from .builders import (
    FAMILY_SPECS,
    MOE_SPECS,
    PHI3_SPEC,
    ROPE_SPECS,
    SENTENCES,
    SINK_SPECS,
    SPECS_BY_NAME,
    copy_with_config,
    save_tiny,
)
from .helpers import inspect

TOL = 1e-5
NEW_SPECS = (*ROPE_SPECS, *FAMILY_SPECS, *MOE_SPECS, *SINK_SPECS)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    return {spec.name: save_tiny(spec, root / spec.name) for spec in NEW_SPECS}


def _config(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "config.json").read_text(encoding="utf-8")))


def _hf(path: Path) -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(path), attn_implementation="eager", experts_implementation="eager").eval()


def _ids(sentence: str, path: Path) -> torch.Tensor:
    from transformers import AutoTokenizer

    return torch.tensor([AutoTokenizer.from_pretrained(str(path))(sentence)["input_ids"]])  # (1, S)


def _worst(model: Any, hf: Any, ids: torch.Tensor) -> float:
    """Largest |ours - transformers'| over every layer's weights and the final hidden states."""
    with torch.inference_mode():
        ours = model(ids)
        theirs = hf(input_ids=ids, output_attentions=True)
    diffs = [float((a - b).abs().max()) for a, b in zip(ours.attentions, theirs.attentions, strict=True)]
    return max(*diffs, float((ours.hidden_states - theirs.last_hidden_state).abs().max()))


# --- scaled RoPE ------------------------------------------------------------------


def _hf_frequencies(hf_config: Any, seq_len: Any = None) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = hf_config.rope_parameters["rope_type"]
    return ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu", seq_len=seq_len)  # type: ignore[no-any-return]


@pytest.mark.parametrize("spec", [*ROPE_SPECS, PHI3_SPEC, SPECS_BY_NAME["gpt_oss"]], ids=lambda s: s.name)
def test_rope_frequencies_equal_transformers_own(spec: Any) -> None:
    """Bit for bit, and different from plain RoPE (the scaling acts)."""
    hf_config = spec.make_config()
    cfg = hf_config.to_dict()
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    partial = spec.model_type == "phi3"
    ours = rope_config(cfg, head_dim, partial_rotary=partial)
    # Dynamic NTK changes nothing up to max_position_embeddings (64): ask for 100 tokens,
    # which transformers' forward pass gives its init function as a tensor.
    length = 100 if ours.rope_type == "dynamic" else 8
    inv_freq, factor = ours.frequencies(length)
    theirs, their_factor = _hf_frequencies(hf_config, torch.tensor(length) if length == 100 else None)
    assert torch.equal(inv_freq, theirs) and factor == their_factor
    plain = RopeConfig("default", ours.theta, ours.rotary_dim, ours.max_position_embeddings).frequencies(length)[0]
    assert not torch.equal(inv_freq, plain)


def test_longrope_switches_to_the_long_factors_past_the_original_context() -> None:
    hf_config = PHI3_SPEC.make_config()
    rope = rope_config(hf_config.to_dict(), 12, partial_rotary=True)
    assert rope.original_max_position_embeddings == 8 and rope.rotary_dim == 6
    short, factor = rope.frequencies(8)
    long, _ = rope.frequencies(9)
    assert torch.equal(short, _hf_frequencies(hf_config, seq_len=None)[0])
    assert torch.equal(long, _hf_frequencies(hf_config, seq_len=9)[0])
    assert not torch.equal(short, long)
    assert factor == pytest.approx(math.sqrt(1 + math.log(64 / 8) / math.log(8)))


def test_dynamic_rope_grows_theta_past_max_position_embeddings(saved: dict[str, Path], tmp_path: Path) -> None:
    """With max_position_embeddings 6, every test sentence is past it: our weights must
    equal a freshly loaded transformers model's (its rope state starts clean) and differ
    from plain RoPE's."""
    config = {**_config(saved["llama-rope-dynamic"]), "max_position_embeddings": 6}
    directory = copy_with_config(saved["llama-rope-dynamic"], tmp_path / "dynamic", config)
    ours: Any = architectures.load(directory)
    assert ours.max_positions is None  # dynamic RoPE runs past max_position_embeddings
    plain: Any = architectures.load(
        directory, {**config, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}
    )
    for sentence in SENTENCES:
        ids = _ids(sentence, directory)
        assert ids.size(1) > 6
        assert _worst(ours, _hf(directory), ids) <= TOL
        assert _worst(plain, _hf(directory), ids) > 1e-3


# --- every quirk matters --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("llama-rope-llama3", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}),
        ("qwen2-rope-yarn", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}}),
        ("gemma2", {"attn_logit_softcapping": None}),
        ("gemma2", {"query_pre_attn_scalar": 16}),
        ("gemma2", {"layer_types": ["full_attention"] * 3}),
        (
            "gemma3_text",
            {
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                    "full_attention": {"rope_type": "default", "rope_theta": 100.0},
                }
            },
        ),
        ("mixtral", {"num_experts_per_tok": 1}),
        ("qwen3_moe", {"norm_topk_prob": True}),
        ("qwen3_moe", {"mlp_only_layers": []}),
        ("gpt_oss", {"swiglu_limit": 7.0}),
    ],
)
def test_each_quirk_changes_the_weights(name: str, change: dict[str, Any], saved: dict[str, Path]) -> None:
    """Read with the quirk switched off, our model must disagree with transformers: the
    tiny checkpoints exercise every quirk, so the comparison tests can fail."""
    ids = _ids(SENTENCES[0], saved[name])
    hf = _hf(saved[name])
    assert _worst(architectures.load(saved[name]), hf, ids) <= TOL
    try:
        wrong = architectures.load(saved[name], {**_config(saved[name]), **change})
    except ModelLoadError:
        return  # the weights no longer fit the changed config: also a difference
    assert _worst(wrong, hf, ids) > 1e-3


def test_gpt_oss_sinks_matter(saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    model: Any = architectures.load(saved["gpt_oss"])
    hf = _hf(saved["gpt_oss"])
    ids = _ids(SENTENCES[0], saved["gpt_oss"])
    assert _worst(model, hf, ids) <= TOL
    for block in model.blocks:
        block.attn.sinks = None
    assert _worst(model, hf, ids) > 1e-3


def test_fused_expert_layout_loads_like_the_per_expert_one(saved: dict[str, Path], tmp_path: Path) -> None:
    """transformers' in-memory MoE layout (experts.gate_up_proj (X, 2I, E), down_proj (X, E, I))."""
    from safetensors.torch import load_file, save_file

    source = saved["mixtral"]
    tensors = load_file(str(source / "model.safetensors"))
    fused: dict[str, torch.Tensor] = {}
    for layer in range(3):
        old = f"model.layers.{layer}.block_sparse_moe."
        new = f"model.layers.{layer}.mlp."
        experts = range(5)
        gate_up = [
            torch.cat((tensors.pop(f"{old}experts.{e}.w1.weight"), tensors.pop(f"{old}experts.{e}.w3.weight")))
            for e in experts
        ]
        fused[f"{new}experts.gate_up_proj"] = torch.stack(gate_up)  # (X, 2I, E)
        fused[f"{new}experts.down_proj"] = torch.stack([tensors.pop(f"{old}experts.{e}.w2.weight") for e in experts])
        fused[f"{new}gate.weight"] = tensors.pop(f"{old}gate.weight")
    directory = tmp_path / "fused"
    directory.mkdir()
    for item in source.iterdir():
        if item.name != "model.safetensors":
            (directory / item.name).write_bytes(item.read_bytes())
    save_file({**tensors, **fused}, str(directory / "model.safetensors"))
    ids = _ids(SENTENCES[0], source)
    assert _worst(architectures.load(directory), _hf(source), ids) <= TOL


@pytest.mark.parametrize(
    ("name", "drop", "add"),
    [
        # Gemma 3 as configs on the Hub still say it: global θ and scaling at the top level,
        # the local θ as rope_local_base_freq, the layer pattern as a period.
        (
            "gemma3_text",
            ("rope_parameters", "layer_types"),
            {
                "rope_theta": 10000.0,
                "rope_local_base_freq": 100.0,
                "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                "sliding_window_pattern": 3,
            },
        ),
        # Llama 3.1 and Qwen2.5 as transformers 4 saved them: rope_scaling + top-level rope_theta.
        (
            "llama-rope-llama3",
            ("rope_parameters",),
            {
                "rope_theta": 500.0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                },
            },
        ),
        (
            "qwen2-rope-yarn",
            ("rope_parameters",),
            {
                "rope_theta": 1000.0,
                "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
            },
        ),
        # Phi-3 long context with the old name of longrope (transformers 5 itself then needs
        # original_max_position_embeddings inside rope_scaling too).
        (
            "phi3-longrope",
            ("rope_parameters",),
            {
                "rope_theta": 300.0,
                "partial_rotary_factor": 0.5,
                "rope_scaling": {
                    "type": "su",
                    "short_factor": [1.0, 1.3, 2.1],
                    "long_factor": [1.1, 2.5, 5.0],
                    "original_max_position_embeddings": 8,
                },
            },
        ),
        ("gemma2", ("layer_types",), {}),  # every other layer sliding, from layer 0
        ("gpt_oss", ("layer_types",), {}),
    ],
)
def test_older_config_layouts_mean_the_same(
    name: str, drop: tuple[str, ...], add: dict[str, Any], saved: dict[str, Path], tmp_path: Path
) -> None:
    config = {k: v for k, v in _config(saved[name]).items() if k not in drop}
    directory = copy_with_config(saved[name], tmp_path / name, {**config, **add})
    ids = _ids(SENTENCES[0], directory)
    old, new = architectures.load(directory), architectures.load(saved[name])
    assert _worst(old, _hf(directory), ids) <= TOL
    assert list(old.windows) == list(new.windows)
    with torch.inference_mode():
        assert torch.equal(old(ids).hidden_states, new(ids).hidden_states)


# --- learned attention sinks -----------------------------------------------------------


def test_sinks_and_softcap_in_the_pure_function() -> None:
    """Against the formula written out: w_j = e^{s_j} / (e^{sink} + Σ_k e^{s_k}), with
    s = c·tanh(q·k/(√D·c)) for soft-capping c; masked keys get exactly 0."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 4)
    sinks = torch.tensor([0.5, -1.0, 2.0])
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    out, weights = softmax_attention(q, k, v, mask, softcap=1.5, sinks=sinks)
    s = 1.5 * torch.tanh((q @ k.transpose(-2, -1)) / math.sqrt(8) / 1.5)
    e = torch.exp(s.double()) * mask
    expected = e / (e.sum(-1, keepdim=True) + torch.exp(sinks.double())[None, :, None, None])
    assert torch.allclose(weights.double(), expected, atol=1e-6)
    assert torch.allclose(out.double(), expected @ v.double(), atol=1e-5)
    assert bool((weights.sum(-1) < 1).all()) and bool((weights[..., ~mask] == 0).all())


def test_gpt_oss_rows_sum_to_one_minus_the_sink_share(saved: dict[str, Path]) -> None:
    from attnviz.measures import metrics

    engines: list[Engine] = [load_engine(name, str(saved["gpt_oss"]), "cpu") for name in ("own", "hf")]
    shares = []
    for engine in engines:
        assert engine.shape.attention_sinks
        att = inspect(SENTENCES[0], engine, layers="all")
        assert att.provenance.attention_sinks
        sums = att.weights.sum(-1, dtype="float64")  # (N, H, Q)
        assert float(sums.max()) < 1.0 - 1e-4  # every row loses a visible share to its sink
        assert float(sums.min()) < 0.5  # and some heads most of it
        share = att.sink_share()
        assert share == pytest.approx(1.0 - sums)
        rows = metrics.head_stats(att, 3)
        assert [r.sink_logit for r in rows] == pytest.approx(share[:, :, 3].reshape(-1).tolist())
        assert rows[0].to_dict()["sink_logit"] == pytest.approx(share[0, 0, 3], abs=1e-6)
        shares.append(share)
    assert float(abs(shares[0] - shares[1]).max()) <= TOL
    plain = load_engine("own", str(saved["llama-rope-linear"]), "cpu")
    att = inspect(SENTENCES[0], plain, layers="all")
    assert not plain.shape.attention_sinks and not att.provenance.attention_sinks
    assert (att.sink_share() == 0).all()
    assert all(r.sink_logit is None and "sink_logit" not in r.to_dict() for r in metrics.head_stats(att, 3))


def test_views_say_the_rows_do_not_sum_to_one(saved: dict[str, Path]) -> None:
    from attnviz.measures import metrics
    from attnviz.render.terminal import for_console, render_show
    from attnviz.render.terminal.tables import head_rows_table

    engine = load_engine("own", str(saved["gpt_oss"]), "cpu")
    att = inspect(SENTENCES[0], engine, layers=[1], queries=[3])
    console = Console(record=True, width=140, color_system=None)
    console.print(render_show(att, (3,), **for_console(console)))
    text = console.export_text()
    assert "learned attention sinks" in text and "rows sum to 1 - the logit sink" in text
    share = att.sink_share()[0, 0, 0]
    assert f"logit sink {share:.2f}" in text
    console = Console(record=True, width=140, color_system=None)
    console.print(head_rows_table(metrics.head_stats(att, 3)))
    assert "logit sink" in console.export_text()
    # Not for a model without sinks.
    other = inspect(SENTENCES[0], load_engine("own", str(saved["qwen3"]), "cpu"), layers=[1], queries=[3])
    console = Console(record=True, width=140, color_system=None)
    console.print(render_show(other, (3,), **for_console(console)))
    console.print(head_rows_table(metrics.head_stats(other, 3)))
    assert "logit sink" not in console.export_text()


def test_exported_figures_say_the_rows_do_not_sum_to_one(saved: dict[str, Path]) -> None:
    from attnviz.render.image import matrix_figure, token_figure

    for name, sinks in (("gpt_oss", True), ("qwen3", False)):
        att = inspect(SENTENCES[0], load_engine("own", str(saved[name]), "cpu"), layers="all")
        for fig in (token_figure(att, 3), matrix_figure(att, 1)):
            text = " ".join(" ".join(t.get_text() for t in fig.texts).split())  # wrapped lines joined
            assert ("rows sum to 1 - the logit sink" in text) is sinks


def test_html_page_notes_the_learned_sinks(saved: dict[str, Path]) -> None:
    from attnviz.render.html import page_data
    from attnviz.shape import SINK_NOTE

    for name, sinks in (("gpt_oss", True), ("qwen3", False)):
        att = inspect(SENTENCES[0], load_engine("own", str(saved[name]), "cpu"), layers="all")
        assert (SINK_NOTE in page_data(att)["notes"]) is sinks


def test_sink_flag_survives_npz(saved: dict[str, Path], tmp_path: Path) -> None:
    from attnviz.result import Attention

    att = inspect(SENTENCES[0], load_engine("own", str(saved["gpt_oss"]), "cpu"), layers="all", queries=[2])
    att.save_npz(tmp_path / "a.npz")
    back = Attention.load_npz(tmp_path / "a.npz")
    assert back.provenance.attention_sinks and back.sink_share() == pytest.approx(att.sink_share())
    assert json.loads(att.to_json())["provenance"]["attention_sinks"] is True


# --- refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "change", "named"),
    [
        ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        (
            "llama-rope-linear",
            {"rope_parameters": {"rope_type": "proportional", "factor": 2.0}},
            "rope_type='proportional'",
        ),
        (
            "qwen3",
            {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
            "partial_rotary_factor=0.5",
        ),
        (
            "qwen3",
            {"use_sliding_window": True, "sliding_window": 4, "layer_types": ["chunked_attention"] * 3},
            "'chunked_attention'",
        ),
        (
            "olmo2",
            {"rope_parameters": {"full_attention": {"rope_type": "default"}}},
            "per-layer-type rope_parameters",
        ),
    ],
)
def test_settings_we_do_not_implement_are_refused_by_name(
    name: str, change: dict[str, Any], named: str, saved: dict[str, Path]
) -> None:
    with pytest.raises(UnsupportedArchitectureError) as info:
        architectures.load(saved[name], {**_config(saved[name]), **change})
    assert named in str(info.value) and "own engine" in str(info.value)
    assert "--engine hf" in (hint_for(info.value) or "")


def test_a_scaled_rope_without_its_parameters_is_an_invalid_config(saved: dict[str, Path]) -> None:
    config = {**_config(saved["llama-rope-llama3"]), "rope_parameters": {"rope_type": "llama3", "factor": 8.0}}
    with pytest.raises(ModelLoadError, match="low_freq_factor"):
        architectures.load(saved["llama-rope-llama3"], config)


# --- attnviz check ------------------------------------------------------------------------


@pytest.mark.parametrize("spec", NEW_SPECS, ids=lambda s: s.name)
def test_cli_check_passes(spec: Any, saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    result = CliRunner().invoke(app, ["check", "--model", str(saved[spec.name]), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] is True and data["model_type"] == spec.model_type and data["worst"] <= TOL
    assert data["attention_sinks"] is (spec.model_type == "gpt_oss")


def test_family_modules_declare_what_the_registry_maps_to_them() -> None:
    """The registry is built from each family module's MODEL_TYPES."""
    import importlib

    for name in ("qwen3", "olmo2", "phi3", "gemma", "moe", "gpt_oss"):
        module = importlib.import_module(f"attnviz.architectures.{name}")
        for model_type in module.MODEL_TYPES:
            assert architectures.registry()[model_type] is module, model_type
        assert callable(module.build) and module.RULES and isinstance(module.PREFIXES, tuple)
    # rope.py is a helper, not a family: it declares no model types.
    assert not hasattr(importlib.import_module("attnviz.architectures.rope"), "MODEL_TYPES")


@pytest.mark.parametrize("spec", NEW_SPECS, ids=lambda s: s.name)
def test_bfloat16_follows_transformers_rounding(spec: Any, saved: dict[str, Path]) -> None:
    """In bfloat16 the order of casts matters (OLMo 2 and GPT-OSS scale by the norm weight
    before casting back, OLMo 2 rotates in float32, Mixtral weights its experts in float32):
    we follow transformers' order, so the weights stay within one bfloat16 step of
    its own (measured: equal, on these checkpoints)."""
    own, hf = (load_engine(name, str(saved[spec.name]), "cpu", dtype="bfloat16") for name in ("own", "hf"))
    for sentence in SENTENCES:
        tokens = own.tokenize(sentence)
        theirs = hf.forward(tokens).attentions
        ids = torch.tensor([tokens.ids])
        with torch.inference_mode():
            eager = own.model(ids, fused=False).attentions  # type: ignore[attr-defined]
        fused = own.forward(tokens).attentions
        for a, f, b in zip(eager, fused, theirs, strict=True):
            # The eager reference casts as transformers does: within one bfloat16 step.
            assert float((a.float() - b.float()).abs().max()) <= 2**-7
            # The fused path (issue 9) accumulates in SDPA's order and softmaxes the rows in
            # float32. Each of the two is within the stated bfloat16 tolerance (2e-2) of the
            # float32 weights, so of each other within twice that.
            assert float((f.float() - b.float()).abs().max()) <= 4e-2


def test_sink_share_is_undefined_once_rows_lose_their_raw_mass(saved: dict[str, Path]) -> None:
    """After specials are set aside, or in a max/rollout slot, 1 - the row's sum is not
    the sink's share any more: NaN there (None in compare's rows); a head mean keeps it."""
    from attnviz import transforms
    from attnviz.measures import metrics

    att = inspect(SENTENCES[0], load_engine("own", str(saved["gpt_oss"]), "cpu"), layers="all", queries=[3])
    heads = att.model_heads
    pooled = transforms.head_aggregates(att, ["mean", "max"])
    share = pooled.sink_share()  # (N, H + 2, Q)
    assert share[:, heads] == pytest.approx(att.sink_share().mean(axis=1), abs=1e-6)
    assert np.isnan(share[:, heads + 1]).all() and not np.isnan(share[:, :heads]).any()
    rows = metrics.head_stats(pooled, 3)
    assert [r.sink_logit is None for r in rows] == [h == heads + 1 for _ in att.layers for h in range(heads + 2)]
    hidden = transforms.hide_special(att)
    assert np.isnan(hidden.sink_share()).all()
    assert all(r.sink_logit is None for r in metrics.head_stats(hidden, 3))
