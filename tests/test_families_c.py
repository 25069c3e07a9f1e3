"""Issue 37's Llama-shaped families in the own engine (GLM-4, GLM-4.5, OLMo 3, Cohere2,
EXAONE 4, ...), each on a tiny checkpoint with every quirk switched on
(tests/builders/families_c.py), float32 on the CPU, against transformers eager:

* the row path (``OwnEngine.forward``: fused attention with exact rows, every row and a
  few asked rows) and the eager path, weights and hidden states;
* a padded batch;
* the value norms (``--measure norm``) against the hf engine's, read from transformers'
  own value projections, and head ablation against the hf engine's (a pre-hook on
  transformers' W^O);
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
from attnviz.measures.base import NORM

from .builders import SENTENCES
from .builders.families_c import SPECS_C, SPECS_C_BY_NAME, save_c

TOL = 1e-5


def _save(name: str, directory: Path) -> Path:
    return save_c(SPECS_C_BY_NAME[name], directory)


class _Saved(dict[str, Path]):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        self[name] = path = _save(name, self.root / name)
        return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Saved(tmp_path_factory.mktemp("families_c"))


_ENGINES: dict[str, tuple[Engine, Engine]] = {}


def _engines(name: str, saved: dict[str, Path]) -> tuple[Engine, Engine]:
    if name not in _ENGINES:
        _ENGINES[name] = (load_engine("own", str(saved[name]), "cpu"), load_engine("hf", str(saved[name]), "cpu"))
    return _ENGINES[name]


def _config(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "config.json").read_text(encoding="utf-8")))


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"{tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.double() - b.double()).abs().max())


@pytest.mark.parametrize("spec", SPECS_C, ids=lambda s: s.name)
def test_row_path_and_eager_path_match_transformers(spec: Any, saved: dict[str, Path]) -> None:
    own, hf = _engines(spec.name, saved)
    assert own.files.model_type == spec.model_type
    assert (own.num_layers, own.num_heads, own.num_kv_heads, own.causal) == (
        hf.num_layers,
        hf.num_heads,
        hf.num_kv_heads,
        hf.causal,
    )
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


@pytest.mark.parametrize("spec", SPECS_C, ids=lambda s: s.name)
def test_padded_batch_matches_transformers(spec: Any, saved: dict[str, Path]) -> None:
    own, hf = _engines(spec.name, saved)
    batch = [own.tokenize(s) for s in SENTENCES]
    ids, mask = own._padded(batch)  # type: ignore[attr-defined]
    assert mask.min() == 0
    with torch.inference_mode():
        theirs = hf.model(input_ids=ids, attention_mask=mask, output_attentions=True)  # type: ignore[attr-defined]
        outs = [own.model(ids, attention_mask=mask, fused=fused) for fused in (False, True)]  # type: ignore[operator]
    real = mask.bool()
    for ours in outs:
        for a, b in zip(ours.attentions, theirs.attentions, strict=True):
            assert _diff(a.transpose(1, 2)[real], b.transpose(1, 2)[real]) <= TOL
        assert _diff(ours.hidden_states[real], theirs.last_hidden_state[real]) <= TOL


@pytest.mark.parametrize("spec", SPECS_C, ids=lambda s: s.name)
def test_norms_and_ablation_match_the_hf_engine(spec: Any, saved: dict[str, Path]) -> None:
    """‖f_h(x_j)‖ from our modules against transformers' v_proj and W^O (the hf engine's
    hooks); removing heads through our W^O against a pre-hook on transformers'."""
    from attnviz.measures.ablation import Ablation, Runner

    own, hf = _engines(spec.name, saved)
    tokens = own.tokenize(SENTENCES[0])
    ours, theirs = own.forward(tokens, measure=NORM), hf.forward(tokens, measure=NORM)
    assert ours.value_norms is not None and theirs.value_norms is not None
    for a, b in zip(ours.value_norms, theirs.value_norms, strict=True):
        assert _diff(a, b) <= TOL
    mine, yours = Runner(own, tokens), Runner(hf, tokens)  # each head's z replaced through the taps
    for layer in range(own.num_layers):
        ablation = (layer, Ablation((0, own.num_heads - 1)))
        assert _diff(mine.hidden(ablation), yours.hidden(ablation)) <= TOL
    mean_fill = torch.randn(own.num_heads, own.model.config.head_dim)  # type: ignore[attr-defined, union-attr]
    ablation = (0, Ablation((1,), mean_fill))
    assert _diff(mine.hidden(ablation), yours.hidden(ablation)) <= TOL


@pytest.mark.parametrize("spec", SPECS_C, ids=lambda s: s.name)
def test_cli_check_and_show(spec: Any, saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    result = CliRunner().invoke(app, ["check", "--model", str(saved[spec.name]), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] is True and data["model_type"] == spec.model_type and data["worst"] <= TOL

    def show(engine: str) -> dict[str, Any]:
        args = ["show", SENTENCES[0], "--model", str(saved[spec.name]), "--engine", engine, "--token", "it"]
        done = CliRunner().invoke(app, [*args, "--layer", "all", "--measure", "norm", "--json"])
        assert done.exit_code == 0, done.output
        return dict(json.loads(done.stdout))

    a, b = show("own"), show("hf")
    assert _diff(torch.tensor(a["weights"]), torch.tensor(b["weights"])) <= TOL


# --- each quirk matters ---------------------------------------------------------------------

QUIRKS: list[tuple[str, dict[str, Any]]] = [
    ("glm", {"attention_bias": False}),
    ("glm", {"partial_rotary_factor": 1.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    ("glm4", {"model_type": "glm"}),  # no sandwich norms
    ("glm4_moe", {"use_qk_norm": False}),
    ("glm4_moe", {"routed_scaling_factor": 1.0}),
    ("glm4_moe", {"n_group": 1, "topk_group": 1}),
    ("glm4_moe", {"norm_topk_prob": False}),
    ("glm4_moe", {"first_k_dense_replace": 0}),
    ("olmo3", {"layer_types": ["full_attention"] * 4}),
    ("olmo3", {"rope_parameters": None, "rope_theta": 5000.0}),
    ("cohere2", {"layer_types": ["sliding_attention"] * 4}),  # rotary on every layer
    ("cohere2", {"sliding_window": 64}),
    ("cohere2", {"attention_bias": False}),
    ("exaone4", {"sliding_window": None, "layer_types": ["full_attention"] * 4}),  # rotary on every layer
    ("exaone4", {"sliding_window": 2}),
    ("ministral3", {"rope_parameters": None}),  # transformers' own default: another rope, no temperature
    ("ministral3", {"sliding_window": None}),
    ("seed_oss", {"attention_out_bias": False}),
    ("arcee", {"hidden_act": "relu"}),
    ("apertus", {"model_type": "arcee", "hidden_act": "relu2"}),
    ("ernie4_5", {"use_bias": False}),
    ("ernie4_5_moe", {"moe_layer_end_index": 3}),
    ("ernie4_5_moe", {"moe_num_shared_experts": 0}),
    ("hunyuan_v1_moe", {"moe_topk": 1}),
    ("dots1", {"layer_types": ["full_attention"] * 3}),
    ("dots1", {"n_shared_experts": None}),
    ("dots1", {"routed_scaling_factor": 1.0}),
    ("eurobert", {"model_type": "llama"}),  # Llama's causal mask
    ("eurobert", {"mlp_bias": False}),
    ("modernbert-decoder", {"local_attention": 64}),
    ("modernbert-decoder", {"layer_types": ["full_attention"] * 3}),
    ("hunyuan_v1_dense", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}}),
]


def _worst(model: Any, hf: Any, ids: torch.Tensor) -> float:
    with torch.inference_mode():
        ours = model(ids, fused=False)
        theirs = hf(input_ids=ids, output_attentions=True)
    diffs = [_diff(a, b) for a, b in zip(ours.attentions, theirs.attentions, strict=True)]
    return max(*diffs, _diff(ours.hidden_states, theirs.last_hidden_state))


@pytest.mark.parametrize(("name", "change"), QUIRKS, ids=[f"{n}-{'-'.join(c)}" for n, c in QUIRKS])
def test_each_quirk_changes_the_numbers(name: str, change: dict[str, Any], saved: dict[str, Path]) -> None:
    own, hf = _engines(name, saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    assert _worst(own.model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    config = {**_config(saved[name]), **change}
    if "partial_rotary_factor" in change and isinstance(config.get("rope_parameters"), dict):
        config["rope_parameters"] = {**config["rope_parameters"], **change.get("rope_parameters", {})}
        config["rope_parameters"]["partial_rotary_factor"] = change["partial_rotary_factor"]
    try:
        wrong = architectures.load(saved[name], config)
    except ModelLoadError:
        return  # the weights no longer fit the changed config: also a difference
    assert _worst(wrong, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["glm4_moe", "ernie4_5_moe", "dots1"])
def test_the_correction_bias_chooses_experts(name: str, saved: dict[str, Path]) -> None:
    """The score-correction bias chooses experts: zeroed, the choice and the numbers change."""
    own, hf = _engines(name, saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    model: Any = architectures.load(saved[name])
    routers = [block.mlp.router for block in model.blocks if hasattr(block.mlp, "router")]
    assert len(routers) == 2 and all(r.e_score_correction_bias.abs().sum() > 0 for r in routers)
    with torch.no_grad():
        for router in routers:
            router.e_score_correction_bias.zero_()
    assert _worst(model, hf.model, ids) > 1e-3  # type: ignore[attr-defined]
