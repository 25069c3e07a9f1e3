"""The shipped sample model, samples/circuits-2l: its circuits established with
transformers alone, then found by attnviz.

Ground truth comes from transformers' eager GPT-2 (``output_attentions``, a forward
pre-hook on ``c_proj`` for ablation) on sequences this file draws itself: the
previous-token head (weight on position i−1), the induction head (weight on the token
after the earlier occurrence), the in-context loss, the indirect-object behaviour. Then
attnviz's own commands (``heads --probe induction``, ``compare --ablate``, ``check``) must
name the same heads. The card's sha256 is checked against the shipped weights, and a short
run of samples/train_circuits.py proves the script end to end (the full training stays
out of the suite)."""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from attnviz.cli import app

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "circuits-2l"
SCRIPT = ROOT / "samples" / "train_circuits.py"
SPECIALS = ("<bos>", "<pad>", "<unk>")
HALF = 20  # tokens in each copy of <bos> r r
runner = CliRunner()


def cli(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "200"})


@cache
def reference() -> tuple[Any, dict[str, int]]:
    """transformers' own model (eager attention) and the vocabulary, from the shipped files."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(SAMPLE, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(SAMPLE).get_vocab()


@cache
def repeated_batch(count: int = 100, seed: int = 12345) -> torch.Tensor:
    """(count, 1 + 2·HALF) ids: <bos> r r, r drawn uniformly from the non-special words."""
    _, vocab = reference()
    pool = sorted(i for w, i in vocab.items() if w not in SPECIALS)
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        r = [rng.choice(pool) for _ in range(HALF)]
        rows.append([vocab["<bos>"], *r, *r])
    return torch.tensor(rows)


@cache
def ground_truth() -> dict[str, Any]:
    """Per head (N, H): mean weight on i−1 (queries 2..T−1) and on the token after the
    earlier occurrence (second-copy queries at r_k, k ≥ 1, whose earlier copy is at
    position k+1... so the target is i − HALF + 1); the in-context losses."""
    model, _ = reference()
    ids = repeated_batch()
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    att = torch.stack(out.attentions, 1)  # (B, N, H, T, T)
    T = ids.shape[1]
    q = torch.arange(2, T)
    previous = att[:, :, :, q, q - 1].mean((0, 3))  # (N, H)
    q2 = torch.arange(HALF + 2, T)  # second-copy queries after its first token
    induction = att[:, :, :, q2, q2 - HALF + 1].mean((0, 3))  # (N, H)
    return {
        "previous": previous,
        "induction": induction,
        "loss": second_copy_losses(model, ids),
        "prev_head": _argmax(previous),
        "ind_head": _argmax(induction),
    }


def _argmax(scores: torch.Tensor) -> tuple[int, int]:
    flat = int(scores.argmax())
    return divmod(flat, scores.shape[1])


def second_copy_losses(model: Any, ids: torch.Tensor, ablate: tuple[int, int] | None = None) -> tuple[float, float]:
    """Mean next-token loss on the first copy (tokens 2..HALF) and the second (HALF+2..2·HALF),
    with head ``ablate`` = (layer, head) zeroed before W^O (a pre-hook on c_proj)."""
    hook = None
    if ablate is not None:
        layer, head = ablate
        width = model.config.n_embd // model.config.n_head

        def zero(module: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            z = args[0].clone()
            z[..., head * width : (head + 1) * width] = 0
            return (z,)

        hook = model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero)
    try:
        with torch.no_grad():
            logp = model(input_ids=ids).logits.log_softmax(-1)  # (B, T, V)
    finally:
        if hook is not None:
            hook.remove()
    nll = -logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1): position p predicts p+1
    return float(nll[:, 1:HALF].mean()), float(nll[:, HALF + 1 :].mean())


# --- the shipped files ---------------------------------------------------------------


def card() -> str:
    return (SAMPLE / "README.md").read_text(encoding="utf-8")


def test_the_weights_are_the_ones_the_card_names() -> None:
    named = re.search(r"sha256\(model\.safetensors\) = ([0-9a-f]{64})", card())
    assert named is not None
    assert hashlib.sha256((SAMPLE / "model.safetensors").read_bytes()).hexdigest() == named[1]


def test_the_card_names_the_heads_transformers_finds() -> None:
    truth = ground_truth()
    previous = re.search(r"previous-token head: layer (\d+) head (\d+)", card())
    induction = re.search(r"induction head: layer (\d+) head (\d+)", card())
    assert previous is not None and induction is not None
    assert (int(previous[1]), int(previous[2])) == truth["prev_head"]
    assert (int(induction[1]), int(induction[2])) == truth["ind_head"]


def test_the_checkpoint_is_small_and_loads_through_attnvizs_validation() -> None:
    from attnviz.io.checkpoint import require_tokenizer, validate_checkpoint
    from attnviz.io.models import resolve

    assert (SAMPLE / "model.safetensors").stat().st_size < 4 * 2**20
    files = resolve(str(SAMPLE))
    assert files.model_type == "gpt2"
    assert validate_checkpoint(files.path, files.config)
    assert require_tokenizer(files.path) == ("tokenizer.json",)


def test_check_finds_both_engines_exact_on_it() -> None:
    result = cli("check", "--model", str(SAMPLE))
    assert result.exit_code == 0, result.output


# --- ground truth, with transformers alone -------------------------------------------


def test_layer_0_has_a_previous_token_head() -> None:
    truth = ground_truth()
    layer, head = truth["prev_head"]
    assert layer == 0
    assert float(truth["previous"][layer, head]) > 0.8
    # The previous-token head is the only one of its layer so focused.
    others = [float(truth["previous"][0, h]) for h in range(truth["previous"].shape[1]) if h != head]
    assert max(others) < 0.5


def test_layer_1_has_an_induction_head() -> None:
    truth = ground_truth()
    layer, head = truth["ind_head"]
    assert layer == 1
    assert float(truth["induction"][layer, head]) > 0.5
    # No layer-0 head can do induction (it has no previous-token information to use).
    assert float(truth["induction"][0].max()) < 0.2


def test_the_second_copy_is_predicted_in_context() -> None:
    first, second = ground_truth()["loss"]
    _, vocab = reference()
    assert first > 0.8 * torch.log(torch.tensor(len(vocab) - len(SPECIALS))).item()  # unpredictable
    assert second < 0.5  # induction


def test_removing_the_induction_circuit_raises_the_in_context_loss_most() -> None:
    model, _ = reference()
    truth = ground_truth()
    ids = repeated_batch()
    n, h = model.config.n_layer, model.config.n_head
    loss = {(layer, head): second_copy_losses(model, ids, (layer, head))[1] for layer in range(n) for head in range(h)}
    ranked = sorted(loss, key=loss.__getitem__, reverse=True)
    # Either head of the circuit breaks it: the two largest rises are theirs.
    assert set(ranked[:2]) == {truth["prev_head"], truth["ind_head"]}
    assert loss[truth["ind_head"]] > truth["loss"][1] + 2.0
    assert loss[ranked[2]] < truth["loss"][1] + 1.0


def ioi_prompts(count: int, seed: int) -> list[tuple[str, str, str]]:
    """(prompt, indirect object, subject): the card's first template, names drawn here."""
    names = ["Mary", "John", "Alice", "Bob", "Sarah", "David", "Emma", "James", "Laura", "Michael", "Anna"]
    places, objects = ["store", "park", "school", "garden", "station"], ["drink", "book", "ball", "ring", "letter"]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.sample(names, 2)
        io, s = (a, b) if rng.random() < 0.5 else (b, a)
        prompt = f"When {a} and {b} went to the {rng.choice(places)} , {s} gave a {rng.choice(objects)} to"
        out.append((prompt, io, s))
    return out


def test_the_indirect_object_is_preferred_to_the_subject() -> None:
    model, vocab = reference()
    prompts = ioi_prompts(100, seed=77)
    ids = torch.tensor([[vocab["<bos>"], *(vocab[w] for w in p.split())] for p, _, _ in prompts])
    with torch.no_grad():
        last = model(input_ids=ids).logits[:, -1]  # (B, V)
    io = torch.tensor([vocab[i] for _, i, _ in prompts])
    s = torch.tensor([vocab[x] for _, _, x in prompts])
    diff = last.gather(1, io[:, None]) - last.gather(1, s[:, None])  # (B, 1)
    assert float((diff > 0).float().mean()) > 0.9  # chance: 0.5
    assert float(diff.mean()) > 1.0
    assert float((last.argmax(-1) == io).float().mean()) > 0.5


# --- attnviz finds the same heads ----------------------------------------------------


def test_heads_probe_induction_ranks_the_ground_truth_heads_first() -> None:
    truth = ground_truth()
    result = cli("heads", "--probe", "induction", "--probe-texts", "50", "--model", str(SAMPLE), "--json")
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)["scores"]

    def first(detector: str) -> tuple[int, int]:
        rows = [r for r in scores if r["detector"] == detector]
        best = max(rows, key=lambda r: r["mean"])
        return best["layer"], best["head"]

    assert first("induction") == truth["ind_head"]
    assert first("previous") == truth["prev_head"]


def repeated_text(seed: int = 3) -> tuple[str, int]:
    """A repeated word sequence and the index of a second-copy query (its next token is
    the one after the query word's first occurrence)."""
    _, vocab = reference()
    words = sorted(w for w in vocab if w not in SPECIALS and w.isalpha())
    r = random.Random(seed).sample(words, 12)
    return " ".join(r + r), 1 + 12 + 6  # <bos>, the first copy, six into the second


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_compare_ablate_puts_the_induction_circuit_first(engine: str) -> None:
    truth = ground_truth()
    text, index = repeated_text()
    result = cli(
        "compare", text, "--index", str(index), "--ablate", "--model", str(SAMPLE), "--engine", engine, "--json"
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = doc["rows"]
    drop = {(r["layer"], r["head"]): r["delta_logprob"] for r in rows}
    ranked = sorted(drop, key=drop.__getitem__)  # the largest fall of the right token first
    assert set(ranked[:2]) == {truth["prev_head"], truth["ind_head"]}


# --- the training script, end to end (a short run of a tiny config) ------------------

SHORT = ["--steps", "200", "--d-model", "32", "--mlp", "64", "--batch-repeat", "8", "--batch-ioi", "8"]
SHORT += ["--eval-sequences", "10", "--eval-ioi", "10", "--seed", "3"]


def train_short(out: Path) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *SHORT, "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_a_short_run_writes_a_checkpoint_both_engines_load_and_repeats_exactly(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnviz.io.checkpoint import validate_checkpoint
    from attnviz.io.models import resolve

    summary, log = train_short(tmp_path / "a")
    assert "step 0: loss" in log and "step 199: loss" in log  # the progress, on stderr
    out = tmp_path / "a"
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "metrics.json",
        "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    assert summary["sha256"] == digest and f"sha256(model.safetensors) = {digest}" in (out / "README.md").read_text()
    # Training moved the loss: the templates are learnt first (the random copies need more).
    steps = json.loads((out / "metrics.json").read_text())["log"]
    assert steps[-1]["ioi"] < steps[0]["ioi"] - 1.0
    files = resolve(str(out))
    assert validate_checkpoint(files.path, files.config)
    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    ids = AutoTokenizer.from_pretrained(out)("When Mary and John went to the store")["input_ids"]
    assert model.config.n_embd == 32 and ids[0] == AutoTokenizer.from_pretrained(out).bos_token_id
    result = cli("show", "When Mary and John went to the store", "--token", "store", "--model", str(out), "--json")
    assert result.exit_code == 0, result.output
    # The same seed on the same machine and thread count: the same weights, bit for bit.
    again, _ = train_short(tmp_path / "b")
    assert again["sha256"] == digest


def test_the_script_refuses_a_bad_config_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--d-model", "30", "--heads", "4", "--out", str(tmp_path / "m")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "train_circuits: --d-model 30 is not divisible by --heads 4"
    assert not (tmp_path / "m").exists()
