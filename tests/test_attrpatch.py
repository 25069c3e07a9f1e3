"""Attribution patching (attnviz.measures.attrpatch) proved against transformers alone: the
estimate equals a separate backward pass of transformers' eager model per layer, whose
output projection gets its input z as a leaf that requires grad (a forward pre-hook), the
metric from transformers' own logits; and as the two prompts approach each other the
estimate approaches the exact patching effect (first order: its error shrinks as the
square of the difference)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnviz.engines import load_engine
from attnviz.errors import UsageError
from attnviz.io.models import resolve
from attnviz.measures.attrpatch import Comparison, attribution_patch, compare
from attnviz.measures.lm import load_lm_head
from attnviz.measures.patching import Metric, answer_id, patch_heads
from tests.builders import SPECS_BY_NAME, save_tiny

TOL = 1e-5

O_PROJ: dict[str, Callable[[Any, int], Any]] = {
    "gpt2": lambda m, n: m.transformer.h[n].attn.c_proj,
    "llama": lambda m, n: m.model.layers[n].self_attn.o_proj,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_tiny(SPECS_BY_NAME[name], tmp_path_factory.mktemp(name))
        return made[name]

    return get


def _metric(name: str, logits: torch.Tensor, clean_logits: torch.Tensor, answer: int, wrong: int) -> torch.Tensor:
    logits, clean_logits = logits.double(), clean_logits.double()
    if name == "logit-diff":
        return logits[answer] - logits[wrong]
    logp = torch.log_softmax(logits, -1)
    if name == "logprob":
        return logp[answer]
    if name == "prob":
        return logp[answer].exp()
    logc = torch.log_softmax(clean_logits, -1)
    return -(logc.exp() * (logc - logp)).sum()


def _reference(
    path: Path,
    family: str,
    clean: list[int],
    corrupted: list[int],
    pairs: list[tuple[int, int]],
    metric: str,
    direction: str,
    answer: int,
    wrong: int,
) -> tuple[np.ndarray, np.ndarray, float]:
    """(N, H) estimated metrics, (N, H) normalised estimates and clean − corrupted, from
    transformers alone: per layer, one run of the patched prompt whose W^O input is a leaf
    requiring grad, and its own backward pass."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    heads, layers = model.config.num_attention_heads, model.config.num_hidden_layers
    with torch.no_grad():
        clean_logits = model(input_ids=torch.tensor([clean])).logits[0]
        corrupted_logits = model(input_ids=torch.tensor([corrupted])).logits[0]
    at_clean, at_corrupted = len(clean) - 1, len(corrupted) - 1
    anchor = clean_logits[at_clean]
    c = float(_metric(metric, anchor, anchor, answer, wrong))
    x = float(_metric(metric, corrupted_logits[at_corrupted], anchor, answer, wrong))
    if direction == "denoise":
        run, source, at, moves = corrupted, clean, at_corrupted, [(a, b) for a, b in pairs]
    else:
        run, source, at, moves = clean, corrupted, at_clean, [(b, a) for a, b in pairs]
    out = np.zeros((layers, heads))
    for layer in range(layers):
        seen: dict[str, torch.Tensor] = {}

        def record(_m: Any, args: tuple[Any, ...], seen: dict[str, torch.Tensor] = seen) -> None:
            seen["source"] = args[0][0].detach().clone()

        handle = O_PROJ[family](model, layer).register_forward_pre_hook(record)
        with torch.no_grad():
            model(input_ids=torch.tensor([source]))
        handle.remove()

        def leaf(_m: Any, args: tuple[Any, ...], seen: dict[str, torch.Tensor] = seen) -> tuple[Any, ...]:
            z = args[0].detach().requires_grad_(True)
            seen["z"] = z
            return (z, *args[1:])

        handle = O_PROJ[family](model, layer).register_forward_pre_hook(leaf)
        with torch.enable_grad():
            logits = model(input_ids=torch.tensor([run])).logits[0]
            _metric(metric, logits[at], anchor, answer, wrong).backward()
        handle.remove()
        z, grad, src = seen["z"][0].detach(), seen["z"].grad[0], seen["source"]  # (Q, H·D) each
        d = z.shape[-1] // heads
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            out[layer, h] = sum(
                float((src[s, cols].double() - z[r, cols].double()) @ grad[r, cols].double()) for s, r in moves
            )
    raw = (x if direction == "denoise" else c) + out
    return raw, (raw - x) / (c - x), c - x


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("engine_name", ["own", "hf"])
@pytest.mark.parametrize(("metric", "direction"), [("logit-diff", "denoise"), ("logprob", "noise"), ("kl", "denoise")])
def test_estimate_equals_a_separate_backward_pass_of_transformers(
    tiny: Callable[[str], Path], family: str, engine_name: str, metric: str, direction: str
) -> None:
    path = tiny(family)
    engine = load_engine(engine_name, resolve(str(path)), "cpu")
    lm = load_lm_head(engine)
    clean, corrupted = engine.tokenize("the cat sat by the door"), engine.tokenize("the dog sat by the door")
    answer, _ = answer_id(engine.tokenizer, "mat")
    wrong, _ = answer_id(engine.tokenizer, "door")
    got = attribution_patch(engine, clean, corrupted, Metric(metric, answer, wrong), lm=lm, direction=direction)
    pairs = [(i, i) for i in range(len(clean))]
    raw, want, span = _reference(
        path, family, list(clean.ids), list(corrupted.ids), pairs, metric, direction, answer, wrong
    )
    # The estimated metric to 1e-5; the normalised effect to 1e-5 of clean − corrupted
    # (it divides by that: float32 rounding grows with it).
    np.testing.assert_allclose(got.raw, raw, atol=TOL, rtol=0)
    np.testing.assert_allclose(got.effect, want, atol=TOL / min(1.0, abs(span)), rtol=0)
    assert got.method == "attribution" and got.passes == 2 and np.ptp(got.effect) > 1e-3


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_different_lengths_estimate_at_the_matched_positions(tiny: Callable[[str], Path], direction: str) -> None:
    path = tiny("gpt2")
    engine = load_engine("hf", resolve(str(path)), "cpu")
    lm = load_lm_head(engine)
    clean = engine.tokenize("the cat sat by the door")
    corrupted = engine.tokenize("the small cat sat by the door")
    answer, _ = answer_id(engine.tokenizer, "mat")
    wrong, _ = answer_id(engine.tokenizer, "door")
    got = attribution_patch(engine, clean, corrupted, Metric("logit-diff", answer, wrong), lm=lm, direction=direction)
    pairs = list(got.alignment.pairs)
    assert len(pairs) == len(corrupted) - 1  # "small" has no counterpart: its z is not patched
    raw, want, span = _reference(
        path, "gpt2", list(clean.ids), list(corrupted.ids), pairs, "logit-diff", direction, answer, wrong
    )
    np.testing.assert_allclose(got.raw, raw, atol=TOL, rtol=0)
    np.testing.assert_allclose(got.effect, want, atol=TOL / min(1.0, abs(span)), rtol=0)
    assert any("different lengths" in note for note in got.notes)


def _nudged(path: Path, dest: Path, source: int, target: int, eps: float) -> Path:
    """A copy of the checkpoint whose embedding of ``target`` is that of ``source`` plus
    ``eps`` times a fixed random direction: the two prompts' runs differ by O(eps)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(path, dest)
    weights = next(dest.glob("*.safetensors"))
    tensors = load_file(str(weights))
    name = next(k for k in tensors if k.endswith("wte.weight"))
    wte = tensors[name].clone()
    noise = torch.randn(wte.shape[1], generator=torch.Generator().manual_seed(0))
    wte[target] = wte[source] + eps * noise / noise.norm() * wte[source].norm()
    tensors[name] = wte
    for key in [k for k in tensors if k.endswith("lm_head.weight")]:
        tensors[key] = wte.clone()  # tied in GPT-2: kept tied
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return dest


def test_estimate_approaches_the_exact_effect_as_the_prompts_approach(
    tiny: Callable[[str], Path], tmp_path: Path
) -> None:
    path = tiny("gpt2")
    plain = load_engine("own", resolve(str(path)), "cpu")
    cat, dog = (plain.tokenizer.token_to_id(w) for w in ("cat", "dog"))
    answer, _ = answer_id(plain.tokenizer, "mat")
    wrong, _ = answer_id(plain.tokenizer, "door")
    errors = []
    for eps in (0.1, 0.01):
        engine = load_engine("own", resolve(str(_nudged(path, tmp_path / f"e{eps}", cat, dog, eps))), "cpu")
        lm = load_lm_head(engine)
        clean, corrupted = engine.tokenize("the cat sat by the door"), engine.tokenize("the dog sat by the door")
        metric = Metric("logit-diff", answer, wrong)
        exact = patch_heads(engine, clean, corrupted, metric, lm=lm)
        estimate = attribution_patch(engine, clean, corrupted, metric, lm=lm)
        # In units of the metric (the normalised effect divides by clean − corrupted, O(eps)).
        errors.append(float(np.abs(estimate.raw - exact.raw).max()) / abs(exact.clean_score - exact.corrupted_score))
    # First order: the normalised error is O(eps); ten times closer prompts, about ten times smaller.
    assert errors[1] < errors[0] / 5, errors
    assert errors[1] < 0.02, errors


def test_comparison_flags_gaps_and_sign_flips(tiny: Callable[[str], Path]) -> None:
    engine = load_engine("own", resolve(str(tiny("gpt2"))), "cpu")
    lm = load_lm_head(engine)
    clean, corrupted = engine.tokenize("the cat sat by the door"), engine.tokenize("the dog sat by the door")
    metric = Metric("logit-diff", answer_id(engine.tokenizer, "mat")[0], answer_id(engine.tokenizer, "door")[0])
    exact = patch_heads(engine, clean, corrupted, metric, lm=lm)
    estimate = attribution_patch(engine, clean, corrupted, metric, lm=lm)
    made = np.array([[0.5, -0.3, 0.02], [0.9, 0.0, 0.2]])
    by_hand = np.array([[0.55, 0.3, -0.03], [0.5, 0.0, 0.2]])
    from dataclasses import replace

    comparison = Comparison(replace(exact, effect=made), replace(estimate, effect=by_hand))
    flags = comparison.flags()
    assert flags.tolist() == [["", "sign", ""], ["gap", "", ""]]  # L0.H2: opposite signs, both under 0.05
    assert [row[0] for row in comparison.disagreements()] == ["L0.H1", "L1.H0"]
    doc = json.loads(json.dumps(compare(exact, estimate).to_dict()))
    assert doc["kind"] == "patch-comparison" and doc["exact"]["method"] == "exact"
    assert doc["attribution"]["method"] == "attribution"
    np.testing.assert_allclose(np.array(doc["difference"]), estimate.effect - exact.effect, atol=1e-12)
    with pytest.raises(ValueError, match="direction"):
        compare(exact, replace(estimate, direction="noise"))


def test_noising_with_kl_or_hidden_is_refused(tiny: Callable[[str], Path]) -> None:
    engine = load_engine("own", resolve(str(tiny("gpt2"))), "cpu")
    lm = load_lm_head(engine)
    clean, corrupted = engine.tokenize("the cat sat"), engine.tokenize("the dog sat")
    for name in ("kl", "hidden"):
        with pytest.raises(UsageError, match="gradient at the clean run is 0") as info:
            attribution_patch(engine, clean, corrupted, Metric(name), lm=lm, direction="noise")
        assert info.value.reason == "patch_metric"


def test_cli_method_both_json_equals_python_and_files(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    from tests.helpers import in_process, one_error_line

    path = str(tiny("llama"))
    args = ("patch", "the cat sat by the door", "the dog sat by the door", "--answer", "mat", "--wrong", "door")
    npz = tmp_path / "both.npz"
    done = in_process(*args, "--model", path, "--method", "both", "--json", "--npz", str(npz))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    engine = load_engine("own", resolve(path), "cpu")
    lm = load_lm_head(engine)
    a, b = engine.tokenize(args[1]), engine.tokenize(args[2])
    metric = Metric("logit-diff", answer_id(engine.tokenizer, "mat")[0], answer_id(engine.tokenizer, "door")[0])
    estimate = attribution_patch(engine, a, b, metric, lm=lm)
    np.testing.assert_allclose(np.array(doc["attribution"]["effect"], dtype=float), estimate.effect, atol=1e-9)
    saved = np.load(npz)
    np.testing.assert_allclose(saved["estimate"], estimate.effect, atol=1e-9)
    np.testing.assert_allclose(saved["effect"], np.array(doc["exact"]["effect"], dtype=float), atol=1e-12)
    alias = in_process(*args, "--model", path, "--attribution", "--json")
    assert json.loads(alias.stdout) == doc
    text = in_process(*args, "--model", path, "--attribution", "--no-pager", env={"NO_COLOR": "1"})
    flat = " ".join(text.stdout.split())
    assert text.returncode == 0 and "attribution patching beside it" in flat and "Pearson r" in flat
    only = in_process(*args, "--model", path, "--method", "attribution", "--json")
    assert json.loads(only.stdout)["label"].startswith("estimated by attribution patching")

    class Result:
        def __init__(self, done: Any) -> None:
            self.exit_code, self.stdout, self.stderr = done.returncode, done.stdout, done.stderr
            self.output = done.stdout + done.stderr

    refused = in_process(*args, "--model", path, "--method", "both", "--direction", "noise", "--metric", "kl")
    assert "gradient at the clean run is 0" in one_error_line(Result(refused), 2)
