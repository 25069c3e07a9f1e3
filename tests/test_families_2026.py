"""Issue 37 in the own engine: multi-head latent attention (DeepSeek-V2, DeepSeek-V3,
GLM-4.7-Flash), each against transformers eager on a tiny checkpoint with every quirk
switched on (tests/builders/families_2026.py), float32 on the CPU:

* weights and hidden states: the row path (what ``show`` runs), asked rows, the eager
  path (what ``check`` runs), a padded batch, a long input in many row blocks;
* the norm measure against the values transformers decompresses (its ``kv_b_proj``'s
  value rows) through its own W^O blocks, computed here apart from attnviz.measures.norms;
* head ablation against transformers with a pre-hook on ``o_proj`` zeroing the head's
  Dv columns (tests/test_ablation.py's ``Reference``);
* explain against the q, k and v transformers hands its attention function;
* ``attnviz check`` and ``attnviz show`` through the CLI;
* each quirk matters: switched off, the numbers no longer match.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnviz import architectures
from attnviz.engines import Engine, load_engine
from attnviz.errors import ModelLoadError
from attnviz.measures.base import NORM

from .builders import SENTENCES
from .builders.families_2026 import MISTRAL4_ROPE, SPECS_2026, SPECS_2026_BY_NAME, YARN, save_2026

TOL = 1e-5
MLA = tuple(
    spec
    for spec in SPECS_2026
    if spec.model_type in ("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "mistral4", "deepseek_v32", "glm_moe_dsa")
)
LLAMA4 = tuple(spec for spec in SPECS_2026 if spec.model_type == "llama4_text")
BAMBA = tuple(spec for spec in SPECS_2026 if spec.model_type in ("bamba", "granitemoehybrid"))
# Families whose attention output splits by head into value norms (not Qwen3-Next's gated heads).
NORMED = MLA + LLAMA4 + BAMBA
LONG = " ".join(SENTENCES * 2)  # 69 tokens, in row blocks of 4


class _Saved(dict[str, Path]):
    """Tiny checkpoints saved on first use (a test of one family builds only its own)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        self[name] = path = save_2026(SPECS_2026_BY_NAME[name], self.root / name)
        return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Saved(tmp_path_factory.mktemp("families_2026"))


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


def _worst(model: Any, hf: Any, ids: torch.Tensor) -> float:
    """Largest |ours - transformers'| over every layer's weights and the final hidden states."""
    with torch.inference_mode():
        ours = model(ids, fused=False)
        theirs = hf(input_ids=ids, output_attentions=True)
    diffs = [_diff(a, b) for a, b in zip(ours.attentions, theirs.attentions, strict=True)]
    return max(*diffs, _diff(ours.hidden_states, theirs.last_hidden_state))


# --- weights and hidden states ----------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS_2026, ids=lambda s: s.name)
def test_row_path_and_eager_path_match_transformers(spec: Any, saved: dict[str, Path]) -> None:
    own, hf = _engines(spec.name, saved)
    assert own.files.model_type == spec.model_type
    assert (own.num_layers, own.num_heads, own.num_kv_heads) == (hf.num_layers, hf.num_heads, hf.num_kv_heads)
    assert own.causal
    for sentence in SENTENCES:
        tokens = own.tokenize(sentence)
        theirs = hf.forward(tokens)
        rows = own.forward(tokens)
        asked = (1, len(tokens) - 1)
        some = own.forward(tokens, queries=asked)
        with torch.inference_mode():
            eager = own.model(torch.tensor([tokens.ids]), fused=False)  # type: ignore[operator]
        assert len(rows.attentions) == len(eager.attentions) == len(theirs.attentions) == len(own.shape.layers)
        for layer, b in enumerate(theirs.attentions):
            assert _diff(rows.attentions[layer], b) <= TOL, f"{spec.name} rows, layer {layer}: {sentence!r}"
            assert _diff(some.attentions[layer], b[:, :, list(asked)]) <= TOL, f"{spec.name} asked rows {layer}"
            assert _diff(eager.attentions[layer], b) <= TOL, f"{spec.name} eager, layer {layer}: {sentence!r}"
        for out in (rows, some, eager):
            assert _diff(out.hidden_states, theirs.hidden_states) <= TOL, f"{spec.name} hidden: {sentence!r}"


@pytest.mark.parametrize("spec", SPECS_2026, ids=lambda s: s.name)
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


@pytest.mark.parametrize(
    "name",
    [
        "deepseek_v3",
        "deepseek_v2",
        "llama4_text",
        "qwen3_next",
        "qwen3_5_text",
        "deepseek_v32",
        "gemma4_text",
        "gemma3n_text",
        "lfm2",
        "lfm2_moe",
        "bamba",
        "granitemoehybrid",
    ],
)
def test_long_input_in_row_blocks_matches_full_matrices(
    name: str, saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 69-token input, the row path cut into blocks of a few rows (as a long input
    is), against our eager full matrices and transformers'."""
    from attnviz.nn import rows

    own, hf = _engines(name, saved)
    tokens = own.tokenize(LONG)
    assert len(tokens) > 50
    theirs = hf.forward(tokens)
    monkeypatch.setattr(rows, "CHUNK_ELEMENTS", 4 * len(tokens) * own.num_heads)  # 4 rows a block
    every = own.forward(tokens)
    asked = (0, 17, len(tokens) - 1)
    some = own.forward(tokens, queries=asked)
    assert len(every.attentions) == len(theirs.attentions) == len(own.shape.layers)
    for slot, b in enumerate(theirs.attentions):
        assert _diff(every.attentions[slot], b) <= TOL
        assert _diff(some.attentions[slot], b[:, :, list(asked)]) <= TOL
    # A hybrid's Gated DeltaNet runs this input in two chunks of the delta rule (64 + 5);
    # LFM2's convolutions slide over all of it; Bamba's Mamba2 scan runs five chunks of 16.
    assert _diff(every.hidden_states, theirs.hidden_states) <= TOL


# --- the norm measure -----------------------------------------------------------------------------


def _transformers_value_norms(hf: Engine, tokens: Any) -> list[torch.Tensor]:
    """(H, S) per layer: ‖v_hj · W_h^O‖ with v the value rows of transformers' own
    ``kv_b_proj`` output (its decompressed values) and W_h^O head h's columns of its
    ``o_proj`` weight, by hand; a hybrid's attention layers alone."""
    model: Any = hf.model  # type: ignore[attr-defined]
    config = model.config
    mla = hasattr(config, "kv_lora_rank")
    heads = config.num_attention_heads
    # MLA: the value rows of kv_b_proj; otherwise v_proj, one value head per group of query heads.
    nope, dv = (config.qk_nope_head_dim, config.v_head_dim) if mla else (0, config.head_dim)
    groups = heads // config.num_key_value_heads if not mla else 1
    seen: list[torch.Tensor] = []
    handles = [
        getattr(layer.self_attn, "kv_b_proj" if mla else "v_proj").register_forward_hook(
            lambda m, args, out: seen.append(out.detach())
        )
        for layer in model.layers
        if getattr(layer, "self_attn", None) is not None
    ]
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([tokens.ids]))
    finally:
        for handle in handles:
            handle.remove()
    out = []
    attention = [layer for layer in model.layers if getattr(layer, "self_attn", None) is not None]
    for layer, kv in zip(attention, seen, strict=True):
        v = kv.reshape(-1, heads // groups, nope + dv)[..., nope:].double()  # (S, G, Dv), batch 1
        v = v.repeat_interleave(groups, dim=1)  # (S, H, Dv): query head h reads value head h // (H/G)
        w_o = layer.self_attn.o_proj.weight.detach().double()  # (E, H·Dv)
        out.append(
            torch.stack(
                [torch.linalg.vector_norm(v[:, h] @ w_o[:, h * dv : (h + 1) * dv].t(), dim=-1) for h in range(heads)]
            )
        )
    return out


@pytest.mark.parametrize("spec", NORMED, ids=lambda s: s.name)
def test_value_norms_are_the_decompressed_values_through_w_o(spec: Any, saved: dict[str, Path]) -> None:
    own, hf = _engines(spec.name, saved)
    tokens = own.tokenize(SENTENCES[0])
    expected = _transformers_value_norms(hf, tokens)
    out = own.forward(tokens, measure=NORM)
    assert out.value_norms is not None and len(out.value_norms) == len(own.shape.layers)
    for layer, norms in enumerate(out.value_norms):
        assert norms.shape == (1, own.num_heads, len(tokens))
        assert _diff(norms[0], expected[layer]) <= TOL * max(1.0, float(expected[layer].max()))


def test_cli_show_norm_measure_runs(saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    args = ["show", SENTENCES[0], "--model", str(saved["deepseek_v3"]), "--token", "it", "--measure", "norm"]
    result = CliRunner().invoke(app, [*args, "--layer", "all", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["measure"] == "norm"


# --- head ablation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["deepseek_v3", "glm4_moe_lite", "llama4_text", "glm_moe_dsa", "gemma4_text", "gemma3n_text"]
)
def test_ablation_matches_a_transformers_hook_on_o_proj(name: str, saved: dict[str, Path]) -> None:
    """Each head's Dv columns of o_proj's input zeroed (or set to their mean) in
    transformers, one head per pass, against attnviz's batched ablation."""
    from attnviz.measures.ablation import Runner, ablate_text

    from .test_ablation import Reference

    engine = _engines(name, saved)[0]
    tokens = engine.tokenize(SENTENCES[1])
    ref = Reference(saved[name], "llama")  # layers[i].self_attn.o_proj, as Llama's
    for mode in ("zero", "mean"):
        expect = ref.effects(list(tokens.ids), None, engine.num_layers, engine.num_heads, mode)
        got = ablate_text(Runner(engine, tokens), mode=mode, batch=2)
        np.testing.assert_allclose(got.effect, expect, atol=TOL, rtol=0, err_msg=f"{name} {mode}")
        assert np.abs(expect).max() > 1e-3


# --- explain ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v3-plain-q",
        "llama4_text",
        "deepseek_v32",
        "glm_moe_dsa",
        "gemma4_text",
        "gemma3n_text",
        "lfm2",
        "lfm2_moe",
        "bamba",
        "granitemoehybrid",
        "granitemoehybrid-nope",
    ],
)
def test_explain_matches_what_transformers_scores_with(name: str, saved: dict[str, Path]) -> None:
    """explain's q, k (rope part rotated, as transformers lays it out), scale, weights and
    value norms against the q, k, v transformers hands its attention function; in the
    first and last attention layers (a hybrid's, by model number, its calls by slot)."""
    from attnviz.measures.explain import explain

    from .test_explain import hf_attention

    own, hf = _engines(name, saved)
    tokens = own.tokenize(SENTENCES[0])
    theirs = hf_attention(hf, tokens)
    # The weights of transformers' eager pass: under the recording attention function
    # DeepSeek-V3.2 and GLM-5 hand the indexer's choice to the kernel, which ignores it.
    eager = hf.forward(tokens).attentions
    # (Which also leaves their recorded passes dense after layer 0: there q, k and v are
    # held to transformers' from layer 0 alone, the weights in every layer.)
    sparse = own.files.model_type in ("deepseek_v32", "glm_moe_dsa")
    # A hybrid's first and last attention layers (LFM2, Bamba), transformers' calls by slot.
    first, last = own.shape.layers[0], own.shape.layers[-1]
    for layer, head, query, key in ((first, 0, 5, 1), (last, own.num_heads - 1, len(tokens) - 1, 2)):
        slot = own.shape.layers.index(layer)
        x = explain(own, tokens, query, layer, head, key)
        assert np.abs(x.weights - eager[slot][0, head, query].double().numpy()).max() <= TOL
        if sparse and layer > 0:
            continue
        call = theirs["calls"][slot]
        g = head // (own.num_heads // call["k"].size(1))  # the key/value head (GQA)
        q, k, v = call["q"][0, head, query], call["k"][0, g], call["v"][0, g]  # (D,), (S, D), (S, Dv)
        assert np.abs(x.q - q.double().numpy()).max() <= TOL
        assert np.abs(x.k - k.double().numpy()).max() <= TOL
        assert x.scale == pytest.approx(float(call["scaling"]), rel=1e-6)
        dv = v.size(-1)
        w_o = theirs["w_o"][slot].weight.detach().double()[:, head * dv : (head + 1) * dv]  # (E, Dv)
        norms = torch.linalg.vector_norm(v.double() @ w_o.t(), dim=-1).numpy()
        assert np.abs(x.value_norms - norms).max() <= TOL * max(1.0, float(norms.max()))
        assert x.head_shares.sum() + x.bias_share == pytest.approx(1.0, abs=1e-4)


# --- the CLI ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS_2026, ids=lambda s: s.name)
def test_cli_check_passes(spec: Any, saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    result = CliRunner().invoke(app, ["check", "--model", str(saved[spec.name]), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] is True and data["model_type"] == spec.model_type and data["worst"] <= TOL


@pytest.mark.parametrize("name", ["deepseek_v2", "glm4_moe_lite"])
def test_cli_show_matches_the_hf_engine(name: str, saved: dict[str, Path]) -> None:
    from attnviz.cli import app

    def show(engine: str) -> dict[str, Any]:
        args = ["show", SENTENCES[0], "--model", str(saved[name]), "--engine", engine, "--token", "it"]
        result = CliRunner().invoke(app, [*args, "--layer", "all", "--json"])
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.stdout))

    ours, theirs = show("own"), show("hf")
    assert ours["provenance"]["architecture"] == SPECS_2026_BY_NAME[name].model_type
    a, b = torch.tensor(ours["weights"]), torch.tensor(theirs["weights"])
    assert a.shape == b.shape and _diff(a, b) <= TOL


# --- each quirk matters -------------------------------------------------------------------------------

_DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
QUIRKS: list[tuple[str, dict[str, Any]]] = [
    ("deepseek_v2", {"topk_method": "greedy"}),
    ("deepseek_v2", {"routed_scaling_factor": 1.0}),
    ("deepseek_v2", {"first_k_dense_replace": 0}),
    ("deepseek_v3", {"rope_interleave": False}),
    ("deepseek_v3", {"rope_parameters": _DEFAULT_ROPE}),  # yarn's frequencies and mscale
    (
        "deepseek_v3",
        {"rope_parameters": {**YARN, "mscale_all_dim": 0}},
    ),
    ("deepseek_v3", {"norm_topk_prob": False}),
    ("deepseek_v3", {"routed_scaling_factor": 1.0}),
    ("deepseek_v3", {"topk_group": 4}),
    ("deepseek_v3-plain-q", {"rope_interleave": True}),
    ("glm4_moe_lite", {"n_group": 1, "topk_group": 1}),
    ("mistral4", {"n_group": 1, "topk_group": 1}),
    ("mistral4", {"rope_interleave": False}),
    ("mistral4", {"norm_topk_prob": False}),
    ("mistral4", {"first_k_dense_replace": 0}),
    ("deepseek_v32", {"index_topk": 64}),  # every key: dense attention
    ("deepseek_v32", {"index_topk": 3}),
    ("deepseek_v32", {"model_type": "glm_moe_dsa"}),  # the indexer's RoPE by pairs
    ("glm_moe_dsa", {"indexer_types": ["full", "full", "full"]}),
    ("glm_moe_dsa", {"model_type": "deepseek_v32"}),  # by halves, every layer its own indexer
    ("mistral4", {"rope_parameters": {k: v for k, v in MISTRAL4_ROPE.items() if k != "llama_4_scaling_beta"}}),
]


@pytest.mark.parametrize(("name", "change"), QUIRKS, ids=[f"{n}-{'-'.join(c)}" for n, c in QUIRKS])
def test_each_quirk_changes_the_numbers(name: str, change: dict[str, Any], saved: dict[str, Path]) -> None:
    own, hf = _engines(name, saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    assert _worst(own.model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    try:
        wrong = architectures.load(saved[name], {**_config(saved[name]), **change})
    except ModelLoadError:
        return  # the weights no longer fit the changed config: also a difference
    assert _worst(wrong, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


def test_the_correction_bias_chooses_but_does_not_weigh(saved: dict[str, Path]) -> None:
    """V3's e_score_correction_bias (moved off zero in the tiny checkpoint) changes which
    experts run: zeroed, the numbers disagree."""
    own, hf = _engines("deepseek_v3", saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    model: Any = architectures.load(saved["deepseek_v3"])
    assert _worst(model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    with torch.no_grad():
        for block in model.blocks[1:]:
            block.mlp.routed.correction.zero_()
    assert _worst(model, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


def test_mla_heads_have_their_own_value_width(saved: dict[str, Path]) -> None:
    from attnviz.architectures.mla import LatentAttention

    own, _ = _engines("deepseek_v3", saved)
    attn: Any = own.model.blocks[0].attn  # type: ignore[attr-defined]
    assert isinstance(attn, LatentAttention)
    assert (attn.head_dim, attn.v_dim, attn.o_proj.in_features) == (10, 5, 4 * 5)
    # Every layer's attention is latent: its score terms q (D = 10) and values (Dv = 5).
    from attnviz.nn.taps import Taps

    taps = Taps().record("blocks.*.attn.scores").record("blocks.*.attn.v")
    with own.tapping(taps):
        own.forward(own.tokenize(SENTENCES[0]))
    for i in range(3):
        assert taps[f"blocks.{i}.attn.scores"].q.size(-1) == 10 and taps[f"blocks.{i}.attn.v"].size(-1) == 5


def test_family_module_declares_what_the_registry_maps_to_it() -> None:
    from attnviz.architectures import mla

    assert mla.MODEL_TYPES == ("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "mistral4")
    from attnviz.architectures import dsa

    assert dsa.MODEL_TYPES == ("deepseek_v32", "glm_moe_dsa")
    assert architectures.registry()["glm_moe_dsa"] is dsa
    for model_type in mla.MODEL_TYPES:
        assert architectures.registry()[model_type] is mla


# --- Qwen3-Next: a hybrid of Gated DeltaNet and gated softmax attention ------------------------------

HYBRID = ("qwen3_next", "qwen3_next-dense", "qwen3_5_text", "qwen3_5_moe_text")
LFM2 = ("lfm2", "lfm2-plain", "lfm2_moe", "lfm2_vl")  # short convolutions between plain softmax layers


@pytest.mark.parametrize("name", HYBRID + LFM2)
def test_hybrid_lists_its_softmax_layers_by_model_number(name: str, saved: dict[str, Path]) -> None:
    """Only the full_attention layers have weights, found by their model layer numbers;
    transformers returns one tensor per such layer, in order."""
    own, hf = _engines(name, saved)
    config = _config(saved[name])
    types = config.get("text_config", config)["layer_types"]  # a wrapper's (LFM2-VL) in its text_config
    expected = tuple(i for i, kind in enumerate(types) if kind == "full_attention")
    assert own.shape.num_layers == len(types) and own.shape.attention_layers == expected
    assert own.shape.hybrid and any("hybrid" in note for note in own.shape.notes())
    tokens = own.tokenize(SENTENCES[0])
    theirs = hf.forward(tokens)
    assert len(theirs.attentions) == len(expected)
    for slot, layer in enumerate(expected):
        one = own.forward(tokens, layers=(layer,))
        assert _diff(one.attentions[0], theirs.attentions[slot]) <= TOL, f"layer {layer}"
    with pytest.raises(ValueError, match="no softmax attention"):
        own.forward(tokens, layers=(0,))


def test_chunks_equal_the_token_by_token_recurrence() -> None:
    """The chunked delta rule (what runs) against the readable recurrence, over 150 tokens
    (three chunks, the last one padded), grouped heads and strong decays."""
    from attnviz.architectures.qwen3_next import chunked_gated_delta_rule, gated_delta_rule, l2norm

    gen = torch.Generator().manual_seed(0)
    b, t, h, dk, dv = 2, 150, 3, 6, 5
    q = l2norm(torch.randn(b, t, h, dk, generator=gen)) * dk**-0.5
    k = l2norm(torch.randn(b, t, h, dk, generator=gen))
    v = torch.randn(b, t, h, dv, generator=gen)
    g = -torch.rand(b, t, h, generator=gen) * 2
    beta = torch.rand(b, t, h, generator=gen)
    reference = gated_delta_rule(q, k, v, g, beta)
    assert reference.abs().max() > 0.1
    assert _diff(chunked_gated_delta_rule(q, k, v, g, beta), reference) <= 1e-5
    # A state that forgets nothing and writes fully keeps the last value written to a key.
    unit = torch.zeros(1, 3, 1, 2)
    unit[..., 0] = 1.0
    values = torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)
    out = gated_delta_rule(unit, unit, values, torch.zeros(1, 3, 1), torch.ones(1, 3, 1))
    assert out.flatten().tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("name", HYBRID)
def test_hybrid_norms_and_explain_are_refused_in_one_line(name: str, saved: dict[str, Path]) -> None:
    """The output gate scales a head's mixed values by its query: no value norm of a key alone."""
    from attnviz.cli import app
    from attnviz.errors import MeasureError

    own, _ = _engines(name, saved)
    with pytest.raises(MeasureError, match="gates each head's output"):
        own.forward(own.tokenize(SENTENCES[0]), measure=NORM)
    layer = str(own.shape.attention_layers[0])
    for args in (
        ["show", SENTENCES[0], "--token", "it", "--layer", layer, "--measure", "norm"],
        ["explain", SENTENCES[0], "--token", "it", "--layer", layer, "--head", "0"],
    ):
        result = CliRunner().invoke(app, [*args, "--model", str(saved[name])])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "gates each head's output" in lines[0], result.stderr


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe_text", "lfm2", "lfm2_moe", "bamba", "granitemoehybrid"])
def test_hybrid_ablation_matches_a_transformers_hook_on_o_proj(name: str, saved: dict[str, Path]) -> None:
    """Each head of each softmax layer zeroed (or set to its mean) in the input of
    transformers' o_proj (after the output gate), one head per pass."""
    from attnviz.measures.ablation import Runner, ablate_text

    from .test_ablation import Reference

    engine = _engines(name, saved)[0]
    tokens = engine.tokenize(SENTENCES[1])
    ref = Reference(saved[name], "lfm2" if name.startswith("lfm2") else "llama")  # LFM2's W^O: out_proj
    layers = engine.shape.attention_layers
    for mode in ("zero", "mean"):
        got = ablate_text(Runner(engine, tokens), mode=mode, batch=2, layers=layers)
        for layer in layers:
            # Reference.effects runs every layer below its own; the linear ones have no o_proj to hook.
            expect = _reference_layer(ref, list(tokens.ids), layer, engine.num_heads, mode)
            np.testing.assert_allclose(got.effect[layer], expect, atol=TOL, rtol=0, err_msg=f"layer {layer} {mode}")
            assert np.abs(expect).max() > 1e-3


def _reference_layer(ref: Any, ids: list[int], layer: int, heads: int, mode: str) -> np.ndarray:
    """(H, Q) 1 − cos per head of one layer, transformers with a pre-hook on its o_proj."""
    clean = ref.hidden(ids, None, None).double()
    mean = None
    if mode == "mean":
        seen: list[torch.Tensor] = []
        ref.hidden(ids, None, (layer, lambda mod, args: seen.append(args[0][0].mean(0))))
        mean = seen[0].view(heads, -1)
    out = np.zeros((heads, clean.shape[0]))
    for head in range(heads):

        def ablate(mod: Any, args: tuple[Any, ...], head: int = head) -> Any:
            x = args[0].clone()
            d = x.shape[-1] // heads
            x[..., head * d : (head + 1) * d] = 0.0 if mean is None else mean[head]
            return (x, *args[1:])

        ablated = ref.hidden(ids, None, (layer, ablate)).double()
        out[head] = (1 - torch.nn.functional.cosine_similarity(clean, ablated, dim=-1)).numpy()
    return out


HYBRID_QUIRKS: list[tuple[str, dict[str, Any]]] = [
    ("qwen3_next", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    ("qwen3_next", {"norm_topk_prob": False}),
    ("qwen3_next", {"mlp_only_layers": []}),
    ("qwen3_next-dense", {"rms_norm_eps": 0.5}),
    ("qwen3_5_text", {"model_type": "qwen3_next"}),  # Qwen3-Next's grouped projections
    ("qwen3_5_moe_text", {"layer_types": ["full_attention"] * 5}),
    ("lfm2", {"norm_eps": 0.5}),  # the q/k norms' eps too
    ("lfm2", {"rope_parameters": None}),  # transformers' default theta, 1e6
    ("lfm2_moe", {"use_expert_bias": False}),
    ("lfm2_moe", {"routed_scaling_factor": 1.0}),
    ("lfm2_moe", {"norm_topk_prob": False}),
    ("bamba", {"time_step_limit": [0.0, 1.6]}),  # the lower bound of Δ bites
    ("bamba", {"time_step_limit": [1.0, 1e9]}),  # the upper one too
    ("bamba", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0}}),
    ("bamba", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    ("bamba-plain", {"rms_norm_eps": 0.5}),
    ("granitemoehybrid", {"position_embedding_type": "nope"}),
    ("granitemoehybrid", {"embedding_multiplier": 1.0}),
    ("granitemoehybrid", {"residual_multiplier": 1.0}),
    ("granitemoehybrid", {"attention_multiplier": 8**-0.5}),
    ("granitemoehybrid", {"num_experts_per_tok": 1}),
    ("granitemoehybrid", {"time_step_limit": [0.0, 1e9]}),
    ("granitemoehybrid-nope", {"position_embedding_type": "rope"}),
]


@pytest.mark.parametrize(("name", "change"), HYBRID_QUIRKS, ids=[f"{n}-{'-'.join(c)}" for n, c in HYBRID_QUIRKS])
def test_each_hybrid_quirk_changes_the_numbers(name: str, change: dict[str, Any], saved: dict[str, Path]) -> None:
    own, hf = _engines(name, saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    assert _worst(own.model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    try:
        wrong = architectures.load(saved[name], {**_config(saved[name]), **change})
    except ModelLoadError:
        return
    assert _worst(wrong, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


def test_the_output_gate_and_the_linear_layers_matter(saved: dict[str, Path]) -> None:
    from attnviz.architectures.qwen3_next import GatedAttention

    own, hf = _engines("qwen3_next", saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    model: Any = architectures.load(saved["qwen3_next"])
    assert _worst(model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    for block in model.blocks:
        if isinstance(getattr(block, "attn", None), GatedAttention):
            block.attn.gate_output = lambda z, query: z
    assert _worst(model, hf.model, ids) > 1e-3  # type: ignore[attr-defined]
    model = architectures.load(saved["qwen3_next"])
    with torch.no_grad():
        model.blocks[0].linear_attn.A_log.zero_()  # another decay in the first linear layer
    assert _worst(model, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


def test_lfm2_reads_older_config_keys_and_its_layers_matter(saved: dict[str, Path]) -> None:
    """``full_attn_idxs`` for ``layer_types`` and ``block_ff_dim`` for ``intermediate_size``
    (LFM2's first configs, as transformers reads them) give the same model; the short
    convolutions' gates, taps and biases each change the numbers."""
    own, hf = _engines("lfm2", saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    config = _config(saved["lfm2"])
    older = {k: v for k, v in config.items() if k not in ("layer_types", "intermediate_size")}
    older |= {"full_attn_idxs": [2, 4], "block_ff_dim": config["intermediate_size"], "intermediate_size": 999}
    assert _worst(architectures.load(saved["lfm2"], older), hf.model, ids) <= TOL  # type: ignore[attr-defined]
    for change in ("in_proj.weight", "conv.weight", "conv.bias", "out_proj.bias"):
        model: Any = architectures.load(saved["lfm2"])
        with torch.no_grad():
            model.blocks[1].conv.get_parameter(change).mul_(-1.0)
        assert _worst(model, hf.model, ids) > 1e-3, change  # type: ignore[attr-defined]


def test_own_engine_refuses_to_generate_with_lfm2_in_one_line(saved: dict[str, Path]) -> None:
    """Its convolutions' state is not a key/value cache: refused, as the other hybrids are."""
    from attnviz.errors import UnsupportedArchitectureError
    from attnviz.generation import generate

    own, _ = _engines("lfm2", saved)
    with pytest.raises(UnsupportedArchitectureError, match="does not generate with lfm2"):
        generate(own, own.tokenize(SENTENCES[0]), 2)
    with pytest.raises(ValueError, match="short-convolution layers cannot run from a key/value cache"):
        from attnviz.nn.cache import KVCache

        own.model(torch.tensor([own.tokenize(SENTENCES[0]).ids]), cache=KVCache(own.num_layers))  # type: ignore[operator]


# --- taps ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("deepseek_v3", 2),
        ("qwen3_next", 4),
        ("mistral4", 2),
        ("glm_moe_dsa", 2),
        ("lfm2", 2),
        ("bamba", 4),
        ("granitemoehybrid", 1),
    ],
)
def test_z_tap_is_what_transformers_o_proj_reads(name: str, layer: int, saved: dict[str, Path]) -> None:
    """``blocks.N.attn.z`` (B, Q, H, Dv): MLA's Dv-wide heads, Qwen3-Next's gated ones,
    each equal to the input of transformers' o_proj; v is Dv wide, q and k D wide."""
    from attnviz.nn.taps import Taps

    own, hf = _engines(name, saved)
    tokens = own.tokenize(SENTENCES[0])
    seen: list[torch.Tensor] = []
    attn = hf.model.layers[layer].self_attn  # type: ignore[attr-defined]
    o_proj = attn.out_proj if hasattr(attn, "out_proj") else attn.o_proj  # LFM2's W^O: out_proj
    handle = o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    try:
        hf.forward(tokens)
    finally:
        handle.remove()
    prefix = f"blocks.{layer}.attn"
    taps = Taps().record(f"{prefix}.z").record(f"{prefix}.q").record(f"{prefix}.v")
    with own.tapping(taps):
        own.forward(tokens, layers=(layer,))
    z = taps[f"{prefix}.z"]
    h = own.num_heads
    assert z.shape[:3] == (1, len(tokens), h)
    assert _diff(z.reshape(1, len(tokens), -1), seen[0]) <= TOL
    dv = z.size(-1)
    assert taps[f"{prefix}.v"].size(-1) == dv and taps[f"{prefix}.q"].size(-1) == own.model.blocks[layer].attn.head_dim  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["qwen3_next", "lfm2"])  # attention layers 2 and 4 both
def test_attention_taps_on_a_linear_layer_are_refused(name: str, saved: dict[str, Path]) -> None:
    from attnviz.errors import UsageError
    from attnviz.nn.taps import Taps

    own, _ = _engines(name, saved)
    with pytest.raises(UsageError, match=r"layer 0 has no softmax attention \(its attention layers: 2, 4\)"):
        own.tapping(Taps().record("blocks.0.attn.z"))
    taps = Taps().record("blocks.0.resid_post").record("blocks.*.attn.pattern")
    with own.tapping(taps):  # layer taps of a linear layer, and wildcards, are fine
        own.forward(own.tokenize(SENTENCES[0]))
    assert taps["blocks.0.resid_post"].shape[-1] == 48


@pytest.mark.parametrize(
    ("name", "softmax", "other"),
    [
        ("qwen3_next", [2, 4], 3),
        ("lfm2", [2, 4], 3),
        ("bamba", [1, 4], 2),
        ("granitemoehybrid-nope", [1, 4], 0),
    ],
)
def test_cli_hybrid_layers_by_model_number_on_both_engines(
    name: str, softmax: list[int], other: int, saved: dict[str, Path]
) -> None:
    """``show`` lists the softmax layers under their model numbers, the same weights as
    ``--engine hf``; ``--layer`` on a linear (or Mamba2) layer is one line, exit 2, naming them."""
    from attnviz.cli import app

    path = str(saved[name])
    shown = {}
    for engine in ("own", "hf"):
        args = ["show", SENTENCES[0], "--model", path, "--engine", engine, "--token", "it", "--json"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        shown[engine] = json.loads(result.stdout)
        assert shown[engine]["layers"] == softmax and shown[engine]["provenance"]["attention_layers"] == softmax
    a, b = torch.tensor(shown["own"]["weights"]), torch.tensor(shown["hf"]["weights"])
    assert a.shape == b.shape and _diff(a, b) <= TOL
    result = CliRunner().invoke(app, ["show", SENTENCES[0], "--model", path, "--token", "it", "--layer", str(other)])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    named = ", ".join(map(str, softmax))
    assert len(lines) == 1 and f"layer {other} has no softmax attention" in lines[0] and named in lines[0]


# --- Llama 4 ---------------------------------------------------------------------------------------------

LLAMA4_QUIRKS: list[tuple[str, dict[str, Any]]] = [
    ("llama4_text", {"layer_types": ["full_attention"] * 4}),  # no chunks
    ("llama4_text", {"use_qk_norm": False}),
    ("llama4_text", {"attn_temperature_tuning": False}),
    ("llama4_text", {"floor_scale": 8192}),
    ("llama4_text", {"no_rope_layers": [1, 1, 1, 1], "layer_types": ["chunked_attention"] * 4}),
    ("llama4_text", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
    ("llama4_text-plain", {"num_experts_per_tok": 1}),
]


@pytest.mark.parametrize(("name", "change"), LLAMA4_QUIRKS, ids=[f"{n}-{'-'.join(c)}" for n, c in LLAMA4_QUIRKS])
def test_each_llama4_quirk_changes_the_numbers(name: str, change: dict[str, Any], saved: dict[str, Path]) -> None:
    own, hf = _engines(name, saved)
    ids = torch.tensor([own.tokenize(LONG).ids])  # past the chunk and the temperature's floor
    assert _worst(own.model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    wrong = architectures.load(saved[name], {**_config(saved[name]), **change})
    assert _worst(wrong, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


def test_llama4_layers_are_chunked_nope_and_moe_as_configured(saved: dict[str, Path]) -> None:
    """RoPE layers 0 and 2 see their own chunk of 5 alone; NoPE layers 1 and 3 every token before."""
    own, hf = _engines("llama4_text", saved)
    model: Any = own.model
    assert model.config.rope_layers == (True, False, True, False) and model.chunks == (5, None, 5, None)
    assert model.config.moe_layers == (1, 3)
    tokens = own.tokenize(SENTENCES[0])
    rows = own.forward(tokens, queries=(7,)).attentions  # query 7: chunk 5..9
    assert bool((rows[0][0, :, 0, :5] == 0).all()) and bool((rows[0][0, :, 0, 5:8] > 0).all())
    assert bool((rows[1][0, :, 0, :8] > 0).all())


@pytest.mark.parametrize("name", ["qwen3_next", "lfm2"])
def test_the_explorers_rows_of_a_hybrid_are_kept(name: str, saved: dict[str, Path]) -> None:
    """Qwen3-Next (gated heads, linear-attention layers), LFM2 (short convolutions): the
    explorer's row source keeps the ``scores`` taps of the attention layers (Qwen3-Next's
    first window used to fail with the norm measure's refusal, though weights were asked)
    and answers a later window exactly as a pass does; the norm measure is refused on the
    gated heads alone, and on LFM2 equals a pass's."""
    from attnviz.cli.exploring import RowSource
    from attnviz.errors import MeasureError

    from .helpers import inspect

    own, _ = _engines(name, saved)
    tokens = own.tokenize(SENTENCES[0])
    source = RowSource(own, tokens, own.shape.layers)
    source((1,))
    assert source.kept and source.kept_size > 0
    asked = (2, len(tokens) - 1)
    want = inspect(SENTENCES[0], own, layers=list(own.shape.layers), queries=asked)
    np.testing.assert_array_equal(source(asked).weights, want.weights)
    if name == "qwen3_next":
        with pytest.raises(MeasureError):
            source((2,), "norm")
        return
    normed = inspect(SENTENCES[0], own, layers=list(own.shape.layers), queries=asked, measure="norm")
    np.testing.assert_allclose(source(asked, "norm").weights, normed.weights, atol=TOL, rtol=0)


# --- DeepSeek Sparse Attention: the top-k indexer -------------------------------------------------------


@pytest.mark.parametrize("name", ["deepseek_v32", "glm_moe_dsa"])
def test_indexer_leaves_topk_keys_per_query(name: str, saved: dict[str, Path]) -> None:
    """Past index_topk tokens every head's row has exactly index_topk nonzero weights, at
    the keys transformers' indexer picks (its indices recorded from the module), the
    same for every head of a layer; a shared layer reuses the full layer's keys."""
    own, hf = _engines(name, saved)
    tokens = own.tokenize(LONG)
    k = _config(saved[name])["index_topk"]
    picked: list[torch.Tensor] = []
    handles = [
        layer.self_attn.indexer.register_forward_hook(lambda m, args, out: picked.append(out.long()))
        for layer in hf.model.layers  # type: ignore[attr-defined]
        if layer.self_attn.indexer is not None
    ]
    try:
        hf.forward(tokens)
    finally:
        for handle in handles:
            handle.remove()
    rows = own.forward(tokens).attentions
    kinds = _config(saved[name]).get("indexer_types") or ["full"] * len(rows)
    full = [i for i, kind in enumerate(kinds) if kind == "full"]
    assert len(picked) == len(full)
    for layer, weights in enumerate(rows):
        seen = weights[0] > 0  # (H, S, S)
        assert seen.sum(-1).max() == k and bool((seen[:, k:].sum(-1) == k).all())
        source = picked[full.index(max(i for i in full if i <= layer))][0]  # (S, k)
        expected = torch.zeros(seen.shape[1:], dtype=torch.bool).scatter(-1, source, True)
        expected &= torch.ones_like(expected).tril()
        assert bool((seen == expected[None]).all()), f"{name} layer {layer}"


def test_zeroed_indexer_changes_the_numbers(saved: dict[str, Path]) -> None:
    own, hf = _engines("deepseek_v32", saved)
    ids = torch.tensor([own.tokenize(LONG).ids])
    model: Any = architectures.load(saved["deepseek_v32"])
    assert _worst(model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    with torch.no_grad():
        model.blocks[1].attn.indexer.weights_proj.weight.neg_()  # the opposite keys win
    assert _worst(model, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


# --- Gemma 4 ---------------------------------------------------------------------------------------------

_G4_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1000.0},
}
GEMMA4_QUIRKS: list[tuple[str, dict[str, Any]]] = [
    ("gemma4_text", {"rope_parameters": _G4_ROPE}),  # factor 1: the factor matters
    ("gemma4_text", {"rope_parameters": {**_G4_ROPE, "full_attention": {"rope_type": "default", "rope_theta": 1e3}}}),
    ("gemma4_text", {"sliding_window": 64}),
    ("gemma4_text", {"hidden_size_per_layer_input": 0}),  # no per-layer inputs
    ("gemma4_text", {"enable_moe_block": False}),
    ("gemma4_text", {"top_k_experts": 1}),
]


@pytest.mark.parametrize(("name", "change"), GEMMA4_QUIRKS, ids=[f"{n}-{'-'.join(c)}" for n, c in GEMMA4_QUIRKS])
def test_each_gemma4_quirk_changes_the_numbers(name: str, change: dict[str, Any], saved: dict[str, Path]) -> None:
    own, hf = _engines(name, saved)
    ids = torch.tensor([own.tokenize(LONG).ids])  # past the sliding window
    assert _worst(own.model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    wrong = architectures.load(saved[name], {**_config(saved[name]), **change})
    assert _worst(wrong, hf.model, ids) > 1e-3  # type: ignore[attr-defined]


def test_gemma4_layers_share_keys_and_values_as_configured(saved: dict[str, Path]) -> None:
    """Layers 4 and 5 attend with layers 2 and 3's keys and values (none of their own); the global
    layers have D = 16, one K/V head and no W^V; every layer's output scalar is not 1."""
    own, hf = _engines("gemma4_text", saved)
    model: Any = own.model
    assert model.config.kv_source == (None, None, None, None, 2, 3)
    assert model.config.head_dims == (8, 16) * 3 and model.config.kv_heads == (2, 1) * 3
    attns = [block.attn for block in model.blocks]
    assert [a.k_proj is None for a in attns] == [False] * 4 + [True] * 2
    assert [a.v_proj is None for a in attns] == [False, True, False, True, True, True]
    assert all(float(block.layer_scalar) != 1.0 for block in model.blocks)
    # Keys and values taken from another layer: the checkpoint holds no K/V weights for 4 and 5.
    names = set(dict(hf.model.named_parameters()))  # type: ignore[attr-defined]
    assert not any(n.endswith(("layers.4.self_attn.k_proj.weight", "layers.5.self_attn.k_proj.weight")) for n in names)


@pytest.mark.parametrize("name", ["gemma4_text", "gemma3n_text", "lfm2", "lfm2-plain", "lfm2_moe", "lfm2_vl"])
def test_value_norms_are_the_values_transformers_attends_with_through_w_o(name: str, saved: dict[str, Path]) -> None:
    """‖v_j · W_h^O‖ with v what transformers hands its attention function (after the v norm;
    Gemma 4: the keys' projection on the global layers; layers 2 and 3's values on 4 and 5;
    LFM2: its attention layers alone, W^O its ``out_proj``)."""
    from .test_explain import hf_attention

    own, hf = _engines(name, saved)
    tokens = own.tokenize(SENTENCES[0])
    out = own.forward(tokens, measure=NORM)
    theirs = hf_attention(hf, tokens)
    assert out.value_norms is not None and len(out.value_norms) == len(own.shape.layers) == len(theirs["calls"])
    for layer, norms in enumerate(out.value_norms):
        v = theirs["calls"][layer]["v"][0].double()  # (G, S, Dv)
        group, dv = own.num_heads // v.size(0), v.size(-1)
        w_o = theirs["w_o"][layer].weight.detach().double()  # (E, H·Dv)
        expected = torch.stack(
            [
                torch.linalg.vector_norm(v[h // group] @ w_o[:, h * dv : (h + 1) * dv].t(), dim=-1)
                for h in range(own.num_heads)
            ]
        )
        assert _diff(norms[0], expected) <= TOL * max(1.0, float(expected.max()))


def test_gemma4_bidirectional_everywhere_is_refused_in_one_line(saved: dict[str, Path]) -> None:
    from attnviz.errors import UnsupportedArchitectureError

    path = saved["gemma4_text"]
    with pytest.raises(UnsupportedArchitectureError, match="use_bidirectional_attention='all'"):
        architectures.load(path, {**_config(path), "use_bidirectional_attention": "all"})


# --- Bamba: Mamba2 layers between Llama-like attention layers -------------------------------------------

LONGER = " ".join(SENTENCES * 4)  # 138 tokens: nine chunks of Bamba's scan


def test_bamba_attention_layers_are_attn_layer_indices(saved: dict[str, Path]) -> None:
    """The softmax layers are the config's attn_layer_indices, by model number; transformers
    returns one tensor per such layer, in order; a Mamba2 layer has no weights to ask for."""
    own, hf = _engines("bamba", saved)
    indices = tuple(_config(saved["bamba"])["attn_layer_indices"])
    assert indices == (1, 4) and own.shape.attention_layers == indices and own.shape.num_layers == 5
    tokens = own.tokenize(SENTENCES[0])
    theirs = hf.forward(tokens)
    assert len(theirs.attentions) == len(indices)
    for slot, layer in enumerate(indices):
        assert _diff(own.forward(tokens, layers=(layer,)).attentions[0], theirs.attentions[slot]) <= TOL
    with pytest.raises(ValueError, match="no softmax attention"):
        own.forward(tokens, layers=(0,))


@pytest.mark.parametrize("name", ["bamba", "bamba-plain", "granitemoehybrid", "granitemoehybrid-nope"])
def test_bamba_over_many_chunks_of_the_scan_matches_transformers(name: str, saved: dict[str, Path]) -> None:
    """138 tokens, nine chunks of 16 (the last one padded), with and without groups and
    limits: the weights of both paths and the hidden states."""
    own, hf = _engines(name, saved)
    tokens = own.tokenize(LONGER)
    assert len(tokens) > 100
    theirs = hf.forward(tokens)
    rows = own.forward(tokens)
    with torch.inference_mode():
        eager = own.model(torch.tensor([tokens.ids]), fused=False)  # type: ignore[operator]
    for out in (rows, eager):
        for a, b in zip(out.attentions, theirs.attentions, strict=True):
            assert _diff(a, b) <= TOL
        assert _diff(out.hidden_states, theirs.hidden_states) <= TOL


def test_bamba_chunked_scan_equals_the_token_by_token_scan() -> None:
    """The chunked scan (what runs) against the readable recurrence, over 150 tokens (ten
    chunks, the last one padded), two groups of B and C over six heads, with and without
    the limits of Δ; and the recurrence against a one-channel example worked by hand."""
    from attnviz.architectures.mamba2 import chunked_scan, selective_scan

    gen = torch.Generator().manual_seed(0)
    b, t, h, p, g, n = 2, 150, 6, 4, 2, 5
    x = torch.randn(b, t, h, p, generator=gen)
    dt = torch.randn(b, t, h, generator=gen)
    a = -torch.rand(h, generator=gen) * 3
    bs, cs = torch.randn(b, t, g, n, generator=gen), torch.randn(b, t, g, n, generator=gen)
    d = torch.randn(h, generator=gen)
    for limit in ((0.0, float("inf")), (0.5, 1.2)):
        reference = selective_scan(x, dt, a, bs, cs, d, limit)
        assert reference.abs().max() > 1.0
        assert _diff(chunked_scan(x, dt, a, bs, cs, d, limit, 16), reference) <= 1e-5 * float(reference.abs().max())
    # One head, one channel, a state of one: Δ = softplus(0) = ln 2, A = -1, B = C = 1, D = 0.5:
    # S_1 = ln2·1, S_2 = e^(-ln2)·S_1 + ln2·2 = 2.5·ln2; y = S + 0.5·x.
    one = torch.ones(1, 2, 1, 1)
    out = selective_scan(
        torch.tensor([1.0, 2.0]).view(1, 2, 1, 1),
        torch.zeros(1, 2, 1),
        -torch.ones(1),
        one,
        one,
        torch.tensor([0.5]),
        (0.0, float("inf")),
    )
    ln2 = float(np.log(2.0))
    assert out.flatten().tolist() == pytest.approx([ln2 + 0.5, 2.5 * ln2 + 1.0], abs=1e-6)


def test_bamba_mamba_parts_matter(saved: dict[str, Path]) -> None:
    """Each part of the Mamba2 mixer changes the numbers: the decay A, the skip D, the
    groups of the gated norm."""
    own, hf = _engines("bamba", saved)
    ids = torch.tensor([own.tokenize(SENTENCES[0]).ids])
    assert _worst(own.model, hf.model, ids) <= TOL  # type: ignore[attr-defined]
    for change in ("A_log", "D", "norm"):
        model: Any = architectures.load(saved["bamba"])
        mixer = model.blocks[0].mixer
        with torch.no_grad():
            if change == "norm":
                mixer.norm.groups = 1  # one norm over both groups' channels
            else:
                getattr(mixer, change).zero_()
        assert _worst(model, hf.model, ids) > 1e-3, change  # type: ignore[attr-defined]


def test_bamba_attention_taps_on_a_mamba_layer_are_refused(saved: dict[str, Path]) -> None:
    from attnviz.errors import UsageError
    from attnviz.nn.taps import Taps

    own, hf = _engines("bamba", saved)
    with pytest.raises(UsageError, match=r"layer 0 has no softmax attention \(its attention layers: 1, 4\)"):
        own.tapping(Taps().record("blocks.0.attn.pattern"))
    # The layer taps of a Mamba2 layer: its mixer's output is the layer's attn_out.
    taps = Taps().record("blocks.0.resid_post").record("blocks.0.attn_out")
    seen: list[torch.Tensor] = []
    handle = hf.model.layers[0].mamba.register_forward_hook(lambda m, a, out: seen.append(out.detach()))  # type: ignore[attr-defined]
    try:
        hf.forward(own.tokenize(SENTENCES[0]))
    finally:
        handle.remove()
    with own.tapping(taps):
        own.forward(own.tokenize(SENTENCES[0]))
    assert _diff(taps["blocks.0.attn_out"], seen[0]) <= TOL


def test_bamba_generation_is_refused_in_one_line(saved: dict[str, Path]) -> None:
    """The Mamba2 layers' recurrent state is no key/value cache: the own engine refuses to
    generate (as with the other hybrids), pointing at the hf engine, which generates."""
    from attnviz.cli import app

    args = ["show", SENTENCES[0], "--model", str(saved["bamba"]), "--generate", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "does not generate with bamba" in lines[0] and "--engine hf" in lines[0]


def test_bamba_check_names_the_attention_layers_by_model_number(
    saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check`` on a hybrid: one row per attention layer under its model number (1 and 4,
    not 0 and 1 and three rows of Mamba2 layers it never compared); a layer made wrong
    fails under its own number."""
    from attnviz.architectures.bamba import BambaDecoder
    from attnviz.cli import app

    path = str(saved["bamba"])
    result = CliRunner().invoke(app, ["check", "--model", path, "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["attention"]) == 2 and data["attention_layers"] == [1, 4] and data["passed"]
    result = CliRunner().invoke(app, ["check", "--model", path, "--device", "cpu"])
    rows = [line.split("│")[1].strip() for line in result.stdout.splitlines() if "attention ok" in line]
    assert rows == ["1", "4"] and "PASS: the 2 attention layers and the hidden states" in result.stdout
    real = BambaDecoder.make_attention

    def scaled(self: Any, layer: int) -> Any:
        attn = real(self, layer)
        if layer == 4:
            attn.scale *= 2.0  # the last attention layer's scores twice as sharp
        return attn

    monkeypatch.setattr(BambaDecoder, "make_attention", scaled)
    result = CliRunner().invoke(app, ["check", "--model", path, "--device", "cpu", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["failed_layers"] == [4]


@pytest.mark.parametrize(
    ("name", "change", "words"),
    [
        ("bamba", {"time_step_limit": "wide"}, "time_step_limit"),
        ("bamba", {"time_step_limit": [2.0, 1.0]}, "time_step_limit"),
        ("bamba", {"attn_layer_indices": []}, "nothing has attention weights"),
        ("bamba", {"attn_layer_indices": [7]}, "not layers of 5"),
        ("bamba", {"mamba_d_head": 7}, "mamba_expand"),
        ("granitemoehybrid", {"layer_types": ["mamba", "attention", "mamba", "conv", "attention"]}, "conv"),
    ],
)
def test_bamba_and_granite_configs_refused_before_any_weight(
    name: str, change: dict[str, Any], words: str, saved: dict[str, Path]
) -> None:
    """A config transformers could not run (or that shows nothing) is one clear error."""
    with pytest.raises(ModelLoadError, match=words):
        architectures.load(saved[name], {**_config(saved[name]), **change})
