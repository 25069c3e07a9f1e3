"""Issue 37, the rest of the own engine's 2026 families: the vision-language wrappers read
on text (Gemma 3's ``gemma3``, Mistral 3's ``mistral3`` around Ministral 3 and Mistral 4)
and Mistral 4's latent attention, on the tiny checkpoints of
tests/builders/families_2026.py (every quirk on), against transformers eager, float32, CPU.

Weights, hidden states, padded batches and ``check`` run in tests/test_families_2026.py's
parametrised tests (these specs are in ``SPECS_2026``); here: the value norms and head
ablation against transformers' own modules, generation with the KV cache against
transformers' greedy ``generate``, the LM head of a wrapper, and the families list.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnviz.engines import Engine, load_engine
from attnviz.measures.base import NORM

from .builders import SENTENCES
from .builders.families_2026 import SPECS_2026_BY_NAME, save_2026

TOL = 1e-5
WRAPPED = ("gemma3", "mistral3-ministral3", "mistral3-mistral4")
NAMES = (*WRAPPED, "mistral4")
PROMPT = "the cat sat on the mat and the dog"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wrapped")
    return {name: save_2026(SPECS_2026_BY_NAME[name], root / name) for name in (*NAMES, "gemma4")}


def _language_model(model: Any) -> Any:
    """transformers' text stack: the wrapper's ``language_model``, or the model itself."""
    return getattr(model, "language_model", model)


@pytest.mark.parametrize("name", NAMES)
def test_value_norms_equal_transformers_values_through_w_o(name: str, saved: dict[str, Path]) -> None:
    """‖v_hj · W_h^O‖ from transformers' own value projection (MLA: the value rows of its
    ``kv_b_proj``) and its o_proj weight, by hand, against ``--measure norm``'s."""
    own = load_engine("own", str(saved[name]), "cpu")
    hf: Any = load_engine("hf", str(saved[name]), "cpu")
    tokens = own.tokenize(SENTENCES[0])
    text = _language_model(hf.model)
    config = text.config
    mla = hasattr(config, "kv_lora_rank")
    heads = config.num_attention_heads
    nope, dv = (config.qk_nope_head_dim, config.v_head_dim) if mla else (0, config.head_dim)
    groups = 1 if mla else heads // config.num_key_value_heads
    seen: list[torch.Tensor] = []
    handles = [
        getattr(layer.self_attn, "kv_b_proj" if mla else "v_proj").register_forward_hook(
            lambda m, args, out: seen.append(out.detach())
        )
        for layer in text.layers
    ]
    try:
        hf.forward(tokens)
    finally:
        for handle in handles:
            handle.remove()
    out = own.forward(tokens, measure=NORM)
    assert out.value_norms is not None and len(out.value_norms) == len(text.layers)
    for layer, (module, v) in enumerate(zip(text.layers, seen, strict=True)):
        v = (
            v.reshape(-1, heads // groups, nope + dv)[..., nope:].double().repeat_interleave(groups, dim=1)
        )  # (S, H, Dv)
        w_o = module.self_attn.o_proj.weight.detach().double()  # (E, H·Dv)
        expected = torch.stack(
            [torch.linalg.vector_norm(v[:, h] @ w_o[:, h * dv : (h + 1) * dv].t(), dim=-1) for h in range(heads)]
        )
        got = out.value_norms[layer][0].double()
        assert float((got - expected).abs().max()) <= TOL * max(1.0, float(expected.max())), f"{name} layer {layer}"


def _reference(path: Path) -> Any:
    from .test_ablation import LOCATORS, Reference

    LOCATORS.setdefault("language_model", lambda m, part, i: _language_model(m).layers[i].self_attn.o_proj)
    return Reference(path, "language_model")


@pytest.mark.parametrize("name", ["gemma3", "mistral4", "mistral3-mistral4"])
def test_ablation_matches_a_transformers_hook_on_o_proj(name: str, saved: dict[str, Path]) -> None:
    from attnviz.measures.ablation import Runner, ablate_text

    engine = load_engine("own", str(saved[name]), "cpu")
    tokens = engine.tokenize(SENTENCES[1])
    ref = _reference(saved[name])
    for mode in ("zero", "mean"):
        expect = ref.effects(list(tokens.ids), None, engine.num_layers, engine.num_heads, mode)
        got = ablate_text(Runner(engine, tokens), mode=mode, batch=2)
        np.testing.assert_allclose(got.effect, expect, atol=TOL, rtol=0, err_msg=f"{name} {mode}")
        assert np.abs(expect).max() > 1e-3


def _hf_generate(name: str, path: Path, ids: list[int], count: int) -> list[int]:
    import transformers

    spec = SPECS_2026_BY_NAME[name]
    cls = getattr(transformers, spec.model_class or "AutoModelForImageTextToText")
    model = cls.from_pretrained(str(path), attn_implementation="eager", experts_implementation="eager").eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=count, do_sample=False, pad_token_id=0)
    return [int(i) for i in out[0, len(ids) :]]


@pytest.mark.parametrize("name", (*NAMES, "gemma4"))  # Gemma 4: layers reusing others' keys and values
def test_generation_equals_transformers_and_full_passes(name: str, saved: dict[str, Path]) -> None:
    """The own engine's cached steps: transformers' greedy tokens (the wrapper's LM head:
    tied embeddings, Gemma 3's final soft-cap read from its text config), and each
    step's rows those of one full pass."""
    from attnviz.generation import generate

    engine = load_engine("own", str(saved[name]), "cpu")
    tokens = engine.tokenize(PROMPT)
    got = generate(engine, tokens, 8)
    assert got.ids == _hf_generate(name, saved[name], list(tokens.ids), 8)
    full = torch.tensor([list(tokens.ids) + got.ids])
    with torch.inference_mode():
        reference = engine.model(full, fused=False).attentions  # type: ignore[operator]
    for i, position in enumerate(got.positions):
        expected = torch.stack([w[0, :, position, : position + 1] for w in reference]).float()
        torch.testing.assert_close(got.rows[i], expected, atol=1e-5, rtol=0)


def test_wrapper_lm_head_reads_the_text_configs_soft_cap(saved: dict[str, Path]) -> None:
    from attnviz.measures.lm import load_lm_head

    engine: Engine = load_engine("own", str(saved["gemma3"]), "cpu")
    lm = load_lm_head(engine)
    assert lm is not None and lm.softcap == 5.0
    assert tuple(lm.unembed.shape) == (engine.files.text_config["vocab_size"], 48)


def test_wrappers_are_own_in_the_families_list_and_refuse_an_unknown_language_model(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    from attnviz.engines.support import support
    from attnviz.errors import UnsupportedArchitectureError

    from .builders import copy_with_config

    assert support("gemma3").verdict == support("mistral3").verdict == support("mistral4").verdict == "own"
    source = saved["mistral3-ministral3"]
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config["text_config"]["model_type"] = "jamba"
    odd = copy_with_config(source, tmp_path / "odd", config)
    with pytest.raises(UnsupportedArchitectureError, match="'jamba', the language model of this 'mistral3'"):
        load_engine("own", str(odd), "cpu")


def test_cli_check_and_show_on_a_wrapper(saved: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from attnviz.cli import app

    path = str(saved["gemma3"])
    result = CliRunner().invoke(app, ["check", "--model", path, "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["passed"] is True
    shown = {}
    for engine in ("own", "hf"):
        args = ["show", SENTENCES[0], "--model", path, "--engine", engine, "--token", "it", "--layer", "all", "--json"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        shown[engine] = json.loads(result.stdout)
    a, b = torch.tensor(shown["own"]["weights"]), torch.tensor(shown["hf"]["weights"])
    assert a.shape == b.shape and float((a - b).abs().max()) <= TOL
