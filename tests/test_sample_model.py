"""The shipped sample model, samples/circuits-2l: what it learnt, established with
transformers alone, then found by attnviz.

The model (a 2-layer GPT-NeoX, 4 heads a layer, rotary positions on a quarter of each
head) was trained by samples/train_circuits.py on repeated random sequences, then on
indirect objects too. Ground truth comes from transformers' eager GPT-NeoX
(``output_attentions``; a forward pre-hook on ``attention.dense``, W^O, zeroing or swapping
one head's slice) on texts this file draws itself:

    induction    a layer-0 head puts ~all its weight on the previous token; a layer-1 head
                 on the token after the current token's earlier occurrence; removing the
                 first takes the second copy's loss back to chance, and the induction
                 head with it (K-composition: its keys are the previous-token head's output)
    indirect     from the final "to", a layer-0 head looks at the repeated subject (S2);
    objects      removing it takes the logit difference IO − S from ~7 to ~0, and its
                 output alone, patched from the clean run, restores the answer

(the heads are found here by search, not hard-coded). Then attnviz's own commands
(``heads --probe induction``, ``compare --ablate``, ``compare --target``, ``patch``,
``check``) must name the same heads and numbers. The card's sha256 is checked against the
shipped weights, and a short run of samples/train_circuits.py proves the script end to end
(the full training stays out of the suite)."""

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


def w_o(layer: int) -> Any:
    """transformers' W^O of ``layer``: its input is the heads' outputs z, concatenated."""
    return reference()[0].gpt_neox.layers[layer].attention.dense


def head_width() -> int:
    config = reference()[0].config
    return config.hidden_size // config.num_attention_heads


def forward(ids: torch.Tensor, ablate: tuple[int, int] | None = None) -> Any:
    """transformers' output (logits, attentions) with head ``ablate`` = (layer, head) zeroed
    before W^O by a pre-hook."""
    model, _ = reference()
    hook = None
    if ablate is not None:
        layer, head = ablate
        width = head_width()

        def zero(module: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            z = args[0].clone()
            z[..., head * width : (head + 1) * width] = 0
            return (z,)

        hook = w_o(layer).register_forward_pre_hook(zero)
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
    assert files.model_type == "gpt_neox"
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
    """The clean logit difference, each head's ablated one, and the head found by search."""
    model, _ = reference()
    ids, io, _, _ = ioi_prompts()
    clean = forward(ids)
    n, h = model.config.num_hidden_layers, model.config.num_attention_heads
    ablated = {
        (layer, head): float(logit_diff(forward(ids, (layer, head))).mean()) for layer in range(n) for head in range(h)
    }
    return {
        "clean": clean,
        "diff": float(logit_diff(clean).mean()),
        "ablated": ablated,
        "finder": min(ablated, key=ablated.__getitem__),  # the head the answer needs most
    }


def test_the_indirect_object_is_preferred_to_the_subject() -> None:
    truth = ioi_truth()
    ids, io, _, _ = ioi_prompts()
    assert float((logit_diff(truth["clean"]) > 0).float().mean()) > 0.9  # chance: 0.5
    assert truth["diff"] > 3.0
    assert float((truth["clean"].logits[:, -1].argmax(-1) == io).float().mean()) > 0.9


def test_one_layer_0_head_finds_the_repeated_subject_and_the_answer_needs_it() -> None:
    truth = ioi_truth()
    layer, head = truth["finder"]
    assert layer == 0
    # Without it the model cannot tell the names apart; no other head matters half as much.
    assert abs(truth["ablated"][truth["finder"]]) < 1.0 < truth["diff"] - 3.0
    others = [d for key, d in truth["ablated"].items() if key != truth["finder"]]
    assert min(others) > truth["diff"] / 3
    # Its weight from the final "to": on the subject's second mention (S2), on every order.
    row = truth["clean"].attentions[layer][:, head, -1]  # (B, S)
    assert float(row[:, S2_AT].mean()) > 0.9


# --- attnviz finds the same heads ----------------------------------------------------

PROMPT = "When Mary and John went to the store , John gave a drink to"


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_compare_ablate_measures_each_heads_fall_as_transformers(engine: str) -> None:
    result = cli("compare", PROMPT, "--token", "to:2", "--ablate", "--model", str(SAMPLE), "--engine", engine, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = doc["rows"]
    assert len(rows) == 8
    assert doc["ablation"]["top_token"] == "Mary"  # a word-level entry is a whole word, not '##Mary'
    drop = {(r["layer"], r["head"]): r["delta_logprob"] for r in rows}
    # Every head's fall, from transformers: log p(Mary) clean against with the head removed.
    _, vocab = reference()
    ids = torch.tensor([[vocab["<bos>"], *(vocab[w] for w in PROMPT.split())]])
    clean = forward(ids).logits[0, -1].log_softmax(-1)[vocab["Mary"]]
    falls = {head: float(forward(ids, head).logits[0, -1].log_softmax(-1)[vocab["Mary"]] - clean) for head in drop}
    for head, fall in drop.items():
        assert fall == pytest.approx(falls[head], abs=1e-4)
    assert min(drop, key=drop.__getitem__) == min(falls, key=falls.__getitem__)
    assert min(falls.values()) < -1.0  # some head matters to the answer


def test_compare_target_finds_the_head_on_the_repeated_subject() -> None:
    truth = ioi_truth()
    result = cli("compare", PROMPT, "--token", "to:2", "--target", "John:2", "--model", str(SAMPLE), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    best = max(rows, key=lambda r: r["targets"]["John:2"])
    assert (best["layer"], best["head"]) == truth["finder"]
    # Its weight there is transformers' own.
    _, vocab = reference()
    ids = torch.tensor([[vocab["<bos>"], *(vocab[w] for w in PROMPT.split())]])
    layer, head = truth["finder"]
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
    assert _argmax(effect) == truth["finder"]
    layer, head = truth["finder"]
    assert float(effect[layer, head]) > 0.9
    assert float(effect.abs().flatten().sort().values[-2]) < 0.1  # no other head moves it
    # transformers: the corrupted run with the head's slice of W^O's input from the clean run.
    _, vocab = reference()
    ids = {t: torch.tensor([[vocab["<bos>"], *(vocab[w] for w in t.split())]]) for t in (PROMPT, corrupted)}
    width = head_width()
    caught: list[torch.Tensor] = []
    hook = w_o(layer).register_forward_pre_hook(lambda m, a: caught.append(a[0].clone()))
    forward(ids[PROMPT])
    hook.remove()

    def swap(module: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        z = args[0].clone()
        z[..., head * width : (head + 1) * width] = caught[0][..., head * width : (head + 1) * width]
        return (z,)

    hook = w_o(layer).register_forward_pre_hook(swap)
    try:
        last = forward(ids[corrupted]).logits[0, -1]
    finally:
        hook.remove()
    assert doc["raw"][layer][head] == pytest.approx(float(last[vocab["Mary"]] - last[vocab["John"]]), abs=1e-4)


def _argmax(scores: torch.Tensor) -> tuple[int, int]:
    layer, head = divmod(int(scores.argmax()), scores.shape[1])
    return layer, head


# --- induction: ground truth with transformers alone ---------------------------------


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


def copy_losses(out: Any, ids: torch.Tensor) -> tuple[float, float]:
    """Mean next-token loss (nats) predicting the first copy's tokens 2…HALF and the second
    copy's HALF+2…2·HALF (each <bos> r r)."""
    nll = -out.logits.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1): p predicts p+1
    return float(nll[:, 1:HALF].mean()), float(nll[:, HALF + 1 :].mean())


@cache
def induction_truth() -> dict[str, Any]:
    """Per head: mean weight on i−1 (every query from 2 on) and on the token after the
    earlier occurrence (the second copy's queries from HALF+2 on); the second copy's loss
    clean and with each head removed; the heads found by search."""
    model, _ = reference()
    ids = repeated_batch()
    clean = forward(ids)
    att = torch.stack(clean.attentions, 1)  # (B, N, H, T, T)
    q = torch.arange(2, ids.shape[1])
    previous = att[:, :, :, q, q - 1].mean((0, 3))  # (N, H)
    q2 = torch.arange(HALF + 2, ids.shape[1])
    induction = att[:, :, :, q2, q2 - HALF + 1].mean((0, 3))  # (N, H)
    n, h = previous.shape
    second = {
        (layer, head): copy_losses(forward(ids, (layer, head)), ids)[1] for layer in range(n) for head in range(h)
    }
    return {
        "losses": copy_losses(clean, ids),
        "previous": previous,
        "induction": induction,
        "ablated": second,
        "previous_head": _argmax(previous),
        "induction_head": _argmax(induction),
    }


def test_the_second_copy_is_predicted_in_context_and_the_card_says_so() -> None:
    first, second = induction_truth()["losses"]
    assert first > 5.5  # unpredictable: ln 331 = 5.80
    assert second < 0.5
    assert "- induction: yes" in card()
    # The card's numbers are these, to the printed digits (its sequences are its own draw).
    quoted = re.search(r"first copy\s+([0-9.]+) nats .*second copy ([0-9.]+) nats", card(), flags=re.DOTALL)
    assert quoted is not None
    assert float(quoted[1]) == pytest.approx(first, abs=0.1) and float(quoted[2]) == pytest.approx(second, abs=0.1)


def test_a_previous_token_head_in_layer_0_and_an_induction_head_in_layer_1() -> None:
    truth = induction_truth()
    layer, head = truth["previous_head"]
    assert layer == 0 and float(truth["previous"][layer, head]) > 0.9
    layer, head = truth["induction_head"]
    assert layer == 1 and float(truth["induction"][layer, head]) > 0.9


def test_removing_either_head_of_the_circuit_costs_the_second_copy_most() -> None:
    """The previous-token head is the one head the second copy cannot do without (back to
    about chance); among layer 1's heads, the induction head costs the most."""
    truth = induction_truth()
    ablated, (first, second) = truth["ablated"], truth["losses"]
    ranked = sorted(ablated, key=ablated.__getitem__, reverse=True)
    assert ranked[0] == truth["previous_head"] and ablated[ranked[0]] > first - 0.5
    layer_1 = [key for key in ranked if key[0] == 1]
    assert layer_1[0] == truth["induction_head"] and ablated[layer_1[0]] > second + 1.0


def test_the_induction_heads_keys_are_the_previous_token_heads_output() -> None:
    """K-composition: with the previous-token head removed (its z zeroed before W^O in
    layer 0), the induction head no longer finds the token after the earlier occurrence."""
    truth = induction_truth()
    ids = repeated_batch()
    out = forward(ids, truth["previous_head"])
    layer, head = truth["induction_head"]
    q2 = torch.arange(HALF + 2, ids.shape[1])
    assert float(out.attentions[layer][:, head, q2, q2 - HALF + 1].mean()) < 0.2


def test_heads_probe_induction_scores_equal_transformers_on_the_same_texts() -> None:
    """attnviz's induction score per head on its own probe, recomputed from transformers'
    attentions on the very texts the probe draws (the detector's definition: the weight on
    {j+1 : j+1 < i, id_j = id_i}, averaged over the queries with such a j, then over texts),
    and the heads it ranks first are the circuit's."""
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
    truth = induction_truth()
    for detector, key in (("induction", "induction_head"), ("previous", "previous_head")):
        ranked = sorted((k for k in scores if k[2] == detector), key=scores.__getitem__, reverse=True)
        assert ranked[0][:2] == truth[key]


@pytest.mark.parametrize("engine", ["own", "hf"])
def test_compare_ablate_on_a_repeated_sequence_puts_the_circuit_first(engine: str) -> None:
    """At a token of the second copy, removing the previous-token or the induction head
    lowers log p of the right next token the most (the top two), as transformers measures."""
    truth = induction_truth()
    _, vocab = reference()
    words = {i: w for w, i in vocab.items()}
    ids = repeated_batch()[:1]  # <bos> r r
    text = " ".join(words[int(i)] for i in ids[0, 1:])
    at = HALF + 10  # a query in the second copy; its next token is r's 11th
    result = cli("compare", text, "--index", str(at), "--ablate", "--model", str(SAMPLE), "--engine", engine, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ablation"]["top_token"] == words[int(ids[0, at + 1])]  # induction predicts the copy
    drop = {(r["layer"], r["head"]): r["delta_logprob"] for r in doc["rows"]}
    assert sorted(drop, key=drop.__getitem__)[:2] == sorted(
        [truth["previous_head"], truth["induction_head"]], key=drop.__getitem__
    )
    target = int(ids[0, at + 1])
    clean = forward(ids).logits[0, at].log_softmax(-1)[target]
    for head, fall in drop.items():
        assert fall == pytest.approx(float(forward(ids, head).logits[0, at].log_softmax(-1)[target] - clean), abs=1e-4)


# --- the training script, end to end (a short run of a tiny config) ------------------

SHORT = [
    "--steps",
    "200",
    "--ioi-from",
    "0",
    "--d-model",
    "32",
    "--mlp",
    "64",
    "--batch-repeat",
    "8",
    "--batch-ioi",
    "8",
]
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
    assert model.config.hidden_size == 32 and ids[0] == AutoTokenizer.from_pretrained(out).bos_token_id
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
