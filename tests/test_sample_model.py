"""The shipped sample model, samples/circuits-2l: what it learnt, established with
transformers alone, then found by attnviz.

The model was trained by samples/train_circuits.py on two tasks. The indirect-object task
formed (its card: accuracy 1.0); induction did not form within the run's budget (the card
says so, and a test below holds the card to the weights). Ground truth comes from
transformers' eager GPT-2 (``output_attentions``; a forward pre-hook on ``c_proj`` zeroing
one head's slice for ablation) on prompts this file writes itself:

    layer 0 head 1   from the final "to", half its weight on each of the two names
    layer 1 head 1   from "to", ~all its weight on the repeated subject (S2); removing it
                     takes the logit difference IO − S from ~9.6 to ~0

(the heads are found here by search, not hard-coded). Then attnviz's own commands
(``compare --ablate``, ``compare --target``, ``heads``, ``check``) must name the same heads
and numbers. The card's sha256 is checked against the shipped weights, and a short run of
samples/train_circuits.py proves the script end to end (the full training stays out of the
suite)."""

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
# "When A and B went to the P , S gave a O to": token positions after <bos> at 0.
A_AT, B_AT, S2_AT = 2, 4, 10
runner = CliRunner()


def cli(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "200"})


@cache
def reference() -> tuple[Any, dict[str, int]]:
    """transformers' own model (eager attention) and the vocabulary, from the shipped files."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(SAMPLE, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(SAMPLE).get_vocab()


def card() -> str:
    return (SAMPLE / "README.md").read_text(encoding="utf-8")


def forward(ids: torch.Tensor, ablate: tuple[int, int] | None = None) -> Any:
    """transformers' output (logits, attentions) with head ``ablate`` = (layer, head) zeroed
    before W^O by a pre-hook on c_proj."""
    model, _ = reference()
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
            return model(input_ids=ids, output_attentions=True)
    finally:
        if hook is not None:
            hook.remove()


# --- the shipped files ---------------------------------------------------------------


def test_the_weights_are_the_ones_the_card_names() -> None:
    named = re.search(r"sha256\(model\.safetensors\) = ([0-9a-f]{64})", card())
    assert named is not None
    assert hashlib.sha256((SAMPLE / "model.safetensors").read_bytes()).hexdigest() == named[1]


def test_the_checkpoint_is_small_and_loads_through_attnvizs_validation() -> None:
    from attnviz.io.checkpoint import require_tokenizer, validate_checkpoint
    from attnviz.io.models import resolve

    assert (SAMPLE / "model.safetensors").stat().st_size < 4 * 2**20
    files = resolve(str(SAMPLE))
    assert files.model_type == "gpt2"
    assert validate_checkpoint(files.path, files.config)
    assert require_tokenizer(files.path) == ("tokenizer.json",)


def test_check_finds_our_attention_exact_on_it() -> None:
    result = cli("check", "--model", str(SAMPLE))
    assert result.exit_code == 0, result.output


# --- indirect objects: ground truth with transformers alone --------------------------


@cache
def ioi_prompts(count: int = 100, seed: int = 77) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (B, 15), IO ids, S ids, IO positions): the card's first template, drawn here."""
    _, vocab = reference()
    names = ["Mary", "John", "Alice", "Bob", "Sarah", "David", "Emma", "James", "Laura", "Michael", "Anna"]
    places, objects = ["store", "park", "school", "garden", "station"], ["drink", "book", "ball", "ring", "letter"]
    rng = random.Random(seed)
    rows, io, s, at = [], [], [], []
    for _ in range(count):
        a, b = rng.sample(names, 2)
        first_is_io = rng.random() < 0.5
        i, x = (a, b) if first_is_io else (b, a)
        prompt = f"When {a} and {b} went to the {rng.choice(places)} , {x} gave a {rng.choice(objects)} to"
        rows.append([vocab["<bos>"], *(vocab[w] for w in prompt.split())])
        io.append(vocab[i])
        s.append(vocab[x])
        at.append(A_AT if first_is_io else B_AT)
    return torch.tensor(rows), torch.tensor(io), torch.tensor(s), torch.tensor(at)


def logit_diff(out: Any) -> torch.Tensor:
    """(B,) logit(IO) − logit(S) at the last position."""
    _, io, s, _ = ioi_prompts()
    last = out.logits[:, -1]  # (B, V)
    return (last.gather(1, io[:, None]) - last.gather(1, s[:, None]))[:, 0]


@cache
def ioi_truth() -> dict[str, Any]:
    """The clean logit difference, each head's ablated one, and the heads found by search."""
    model, _ = reference()
    ids, io, _, _ = ioi_prompts()
    clean = forward(ids)
    n, h = model.config.n_layer, model.config.n_head
    ablated = {
        (layer, head): float(logit_diff(forward(ids, (layer, head))).mean()) for layer in range(n) for head in range(h)
    }
    return {
        "clean": clean,
        "diff": float(logit_diff(clean).mean()),
        "ablated": ablated,
        "mover": min(ablated, key=ablated.__getitem__),  # the head the answer needs most
    }


def test_the_indirect_object_is_preferred_to_the_subject() -> None:
    truth = ioi_truth()
    ids, io, _, _ = ioi_prompts()
    assert float((logit_diff(truth["clean"]) > 0).float().mean()) > 0.9  # chance: 0.5
    assert truth["diff"] > 3.0
    assert float((truth["clean"].logits[:, -1].argmax(-1) == io).float().mean()) > 0.9


def test_one_layer_1_head_carries_the_answer_and_looks_at_the_repeated_subject() -> None:
    truth = ioi_truth()
    layer, head = truth["mover"]
    assert layer == 1
    # Without it the model cannot tell the names apart; no other head matters as much.
    assert truth["ablated"][truth["mover"]] < 1.0 < truth["diff"] - 3.0
    others = [d for key, d in truth["ablated"].items() if key != truth["mover"]]
    assert min(others) > truth["diff"] / 2
    # Its weight from the final "to": on the subject's second mention (S2).
    row = truth["clean"].attentions[layer][:, head, -1]  # (B, S)
    assert float(row[:, S2_AT].mean()) > 0.9


def gatherer() -> tuple[int, torch.Tensor, torch.Tensor]:
    """The layer-0 head with the most weight, from the final "to", on the two names; its
    mean weight on the indirect object and on the subject's first mention (S1)."""
    _, _, _, io_at = ioi_prompts()
    s1_at = A_AT + B_AT - io_at
    rows = ioi_truth()["clean"].attentions[0][:, :, -1]  # (B, H, S): from the final "to"
    batch = torch.arange(rows.shape[0])
    on_io, on_s1 = rows[batch, :, io_at].mean(0), rows[batch, :, s1_at].mean(0)  # (H,)
    head = int((on_io + on_s1).argmax())
    return head, on_io[head], on_s1[head]


def test_a_layer_0_head_gathers_both_names() -> None:
    _, on_io, on_s1 = gatherer()
    assert float(on_io) > 0.3 and float(on_s1) > 0.3  # both names, neither preferred
    assert abs(float(on_io - on_s1)) < 0.1


# --- attnviz finds the same heads ----------------------------------------------------

PROMPT = "When Mary and John went to the store , John gave a drink to"


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_compare_ablate_puts_the_name_gatherer_first(engine: str) -> None:
    result = cli("compare", PROMPT, "--token", "to:2", "--ablate", "--model", str(SAMPLE), "--engine", engine, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = doc["rows"]
    assert len(rows) == 8
    assert doc["ablation"]["top_token"] == "Mary"  # a word-level entry is a whole word, not '##Mary'
    drop = {(r["layer"], r["head"]): r["delta_logprob"] for r in rows}
    # The largest fall of "Mary"'s log-probability: the head that gathers the names (without
    # it there is no name to give). (The head on the repeated subject makes the names equally
    # likely: its mark is the logit difference, above, not log p alone.)
    assert min(drop, key=drop.__getitem__) == (0, gatherer()[0])
    # Every head's fall, from transformers: log p(Mary) clean against with the head removed.
    _, vocab = reference()
    ids = torch.tensor([[vocab["<bos>"], *(vocab[w] for w in PROMPT.split())]])
    clean = forward(ids).logits[0, -1].log_softmax(-1)[vocab["Mary"]]
    for head, fall in drop.items():
        cut = forward(ids, head).logits[0, -1].log_softmax(-1)[vocab["Mary"]]
        assert fall == pytest.approx(float(cut - clean), abs=1e-4)


def test_compare_target_finds_the_head_on_the_repeated_subject() -> None:
    truth = ioi_truth()
    result = cli("compare", PROMPT, "--token", "to:2", "--target", "John:2", "--model", str(SAMPLE), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    best = max(rows, key=lambda r: r["targets"]["John:2"])
    assert (best["layer"], best["head"]) == truth["mover"]
    # Its weight there is transformers' own.
    _, vocab = reference()
    ids = torch.tensor([[vocab["<bos>"], *(vocab[w] for w in PROMPT.split())]])
    layer, head = truth["mover"]
    assert best["targets"]["John:2"] == pytest.approx(
        float(forward(ids).attentions[layer][0, head, -1, S2_AT]), abs=1e-5
    )


def test_patch_restores_the_answer_through_the_head_on_the_subject_alone() -> None:
    """Denoising (the prompt with the other name repeated, one head's z from the clean run):
    the head found by ablation above restores the clean logit difference on its own; its
    patched score equals transformers' with the same z swapped in by a pre-hook."""
    truth = ioi_truth()
    corrupted = PROMPT.replace(", John gave", ", Mary gave")
    result = cli("patch", PROMPT, corrupted, "--answer", "Mary", "--wrong", "John", "--model", str(SAMPLE), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    effect = torch.tensor(doc["effect"])  # (N, H)
    assert _argmax(effect) == truth["mover"]
    layer, head = truth["mover"]
    assert float(effect[layer, head]) > 0.9
    assert float(effect.abs().flatten().sort().values[-2]) < 0.1  # no other head moves it
    # transformers: the corrupted run with the head's slice of c_proj's input from the clean run.
    model, vocab = reference()
    ids = {t: torch.tensor([[vocab["<bos>"], *(vocab[w] for w in t.split())]]) for t in (PROMPT, corrupted)}
    width = model.config.n_embd // model.config.n_head
    caught: list[torch.Tensor] = []
    proj = model.transformer.h[layer].attn.c_proj
    hook = proj.register_forward_pre_hook(lambda m, a: caught.append(a[0].clone()))
    forward(ids[PROMPT])
    hook.remove()

    def swap(module: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        z = args[0].clone()
        z[..., head * width : (head + 1) * width] = caught[0][..., head * width : (head + 1) * width]
        return (z,)

    hook = proj.register_forward_pre_hook(swap)
    try:
        last = forward(ids[corrupted]).logits[0, -1]
    finally:
        hook.remove()
    assert doc["raw"][layer][head] == pytest.approx(float(last[vocab["Mary"]] - last[vocab["John"]]), abs=1e-4)


def _argmax(scores: torch.Tensor) -> tuple[int, int]:
    layer, head = divmod(int(scores.argmax()), scores.shape[1])
    return layer, head


# --- induction: not formed, and the card says so --------------------------------------


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


def test_the_card_tells_the_truth_about_induction() -> None:
    ids = repeated_batch()
    out = forward(ids)
    logp = out.logits.log_softmax(-1)  # (B, T, V)
    nll = -logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1): position p predicts p+1
    first, second = float(nll[:, 1:HALF].mean()), float(nll[:, HALF + 1 :].mean())
    formed = second < 0.5 * first
    assert ("- induction: yes" in card()) == formed
    assert ("- induction: no" in card()) == (not formed)
    # The card's numbers are these, to the printed digits (its sequences are its own draw).
    quoted = re.search(r"first copy\s+([0-9.]+) nats .*second copy ([0-9.]+) nats", card(), flags=re.DOTALL)
    assert quoted is not None
    assert float(quoted[1]) == pytest.approx(first, abs=0.1) and float(quoted[2]) == pytest.approx(second, abs=0.1)


def test_heads_probe_induction_scores_equal_transformers_on_the_same_texts() -> None:
    """attnviz's induction score per head on its own probe, recomputed from transformers'
    attentions on the very texts the probe draws (the detector's definition: the weight on
    {j+1 : j+1 < i, id_j = id_i}, averaged over the queries with such a j, then over texts)."""
    from attnviz.corpus.sources import induction_probe
    from attnviz.tokens import load_tokenizer

    result = cli("heads", "--probe", "induction", "--probe-texts", "20", "--model", str(SAMPLE), "--json")
    assert result.exit_code == 0, result.output
    scores = {(r["layer"], r["head"], r["detector"]): r["mean"] for r in json.loads(result.stdout)["scores"]}
    texts = list(induction_probe(load_tokenizer(SAMPLE), count=20, length=20, seed=0))
    ids = torch.tensor([list(t.tokens.ids) for t in texts])  # (20, 41): <bos> r r
    att = torch.stack(forward(ids).attentions, 1).double()  # (B, N, H, T, T)
    per_text = []
    for b in range(ids.shape[0]):
        row = ids[b].tolist()
        hits = []
        for i in range(1, len(row)):
            targets = [j + 1 for j in range(i - 1) if row[j] == row[i]]
            if targets:
                hits.append(att[b, :, :, i, targets].sum(-1))  # (N, H)
        per_text.append(torch.stack(hits).mean(0))
    expected = torch.stack(per_text).mean(0)  # (N, H)
    for layer in range(att.shape[1]):
        for head in range(att.shape[2]):
            assert scores[(layer, head, "induction")] == pytest.approx(float(expected[layer, head]), abs=1e-5)
    assert float(expected.max()) < 0.2  # no induction head, as the card says


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
    # The last line's held-out copies: the saved model's losses on the script's 16 held-out
    # <bos> r r (its generator, seed + 7), recomputed here with transformers.
    shown = re.search(r"step 199: .*held-out copies ([0-9.]+) / ([0-9.]+)", log)
    assert shown is not None
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import train_circuits as tc
    finally:
        sys.path.remove(str(SCRIPT.parent))
    probe = tc.Data(tc.vocabulary(), random.Random(3 + 7))
    rows = torch.tensor([probe.repeated(20) for _ in range(16)])  # (16, 41)
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "a", attn_implementation="eager").eval()
    with torch.no_grad():
        logp = trained(input_ids=rows).logits.log_softmax(-1)
    nll = -logp[:, :-1].gather(-1, rows[:, 1:, None])[..., 0]  # (16, 40): position p predicts p+1
    assert float(shown[1]) == pytest.approx(float(nll[:, 1:20].mean()), abs=2e-3)
    assert float(shown[2]) == pytest.approx(float(nll[:, 21:].mean()), abs=2e-3)
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


def test_the_script_refuses_an_ioi_start_outside_the_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "10", "--ioi-from", "10", "--out", str(tmp_path / "m")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "train_circuits: --ioi-from 10 is not a step of the run (0 to 9)"
    assert not (tmp_path / "m").exists()


def test_the_prr_layout_repeats_a_run_after_a_prefix_of_varying_length() -> None:
    """<bos> p r r: the last 2h tokens are one run seen twice, h and the prefix vary, the
    row fits the context; drawn from the script's own generator."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import train_circuits as tc
    finally:
        sys.path.remove(str(SCRIPT.parent))
    data = tc.Data(tc.vocabulary(), random.Random(5))
    halves, prefixes = set(), set()
    for _ in range(200):
        row = data.prefixed_repeat(64, 6)
        assert row[0] == data.ids["<bos>"] and len(row) <= 64
        # The longest h with row[-2h:-h] == row[-h:] (a run of random words repeats by chance
        # only rarely): at least the minimum, and the prefix is what is left before it.
        h = max(k for k in range(1, (len(row) - 1) // 2 + 1) if row[-2 * k : -k] == row[-k:])
        assert 6 <= h <= 31
        halves.add(h)
        prefixes.add(len(row) - 1 - 2 * h)
    assert len(halves) > 15 and len(prefixes) > 20  # neither the run's length nor its start is fixed
