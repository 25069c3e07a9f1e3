"""Train attnviz's sample model with known circuits: samples/circuits-2l.

A 2-layer GPT-NeoX (4 heads per layer, rotary positions on a quarter of each head's
dimensions) is trained, on a seeded synthetic mix, on two tasks whose mechanisms are known
from the literature, so that a head detector, an ablation or a patching experiment has a
right answer to find (the card says which of them formed; in the shipped run both did):

    repeated random sequences   <bos> r1 … rL r1 … rL: the second copy is predictable only
                                by induction, a previous-token head in layer 0 composed
                                with an induction head in layer 1 (Elhage et al. 2021;
                                Olsson et al. 2022)
    indirect objects            "When Mary and John went to the store , John gave a drink
                                to" → "Mary" (Wang et al. 2022), over a word-level vocabulary
                                of names, places and objects

The model is saved with transformers' ``save_pretrained`` beside a word-level
``tokenizer.json`` built with the ``tokenizers`` library, so attnviz's own engine,
``--engine hf``, ``attnviz check`` and transformers all load it through their real paths.
A model card (README.md in the model directory) records the config, the data, the steps,
the seed, the wall and CPU time, the final metrics and the sha256 of model.safetensors.

    python samples/train_circuits.py                  # the shipped model (the defaults)
    python samples/train_circuits.py --steps 200 --ioi-from 0 --d-model 32 --mlp 64 --out /tmp/m   # a smoke run

Induction needs relative positions: a previous-token head is one rule under rotary
positions, but 64 separate ones under GPT-2's learned absolute positions, and the GPT-2
runs the card of an earlier model lists never formed one. The indirect objects join the mix
at step ``--ioi-from`` (1000): summed in from the start they slowed induction's phase change
past the budget, and once it has formed they are learnt in a few hundred steps.

Everything is seeded (random, torch) and torch runs on ``--threads`` threads with
deterministic algorithms, so a run repeats bit for bit on the same machine and thread
count. The loss is logged with a progress bar on stderr. The directory is written whole
or not at all (a temporary sibling renamed into place).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# --- the vocabulary ------------------------------------------------------------------


def words(text: str) -> list[str]:
    return text.split()


NAMES = words(
    "Mary John Alice Bob Sarah David Emma James Laura Michael Anna Daniel Kate Thomas Lucy "
    "Peter Rose Paul Julia Mark Claire Simon Helen George Amy Henry Clara Victor Nora Oscar "
    "Ruth Adam Eva Frank Grace Hugo Irene Jack Lily Max"
)
PLACES = words(
    "store park school garden station market beach library hospital office church museum "
    "restaurant cafe bank farm river lake hotel airport bakery theatre kitchen harbour"
)
OBJECTS = words(
    "drink book ball ring letter apple bottle key basket gift flower candle hat coin map "
    "cake shirt lamp knife bag pen cup box clock"
)
# The templates' own words; every template ends on the word before the indirect object.
TEMPLATES = (
    "When {A} and {B} went to the {P} , {C} gave a {O} to",
    "Then , {A} and {B} went to the {P} . {C} gave a {O} to",
    "After {A} and {B} arrived at the {P} , {C} handed the {O} to",
    "While {A} and {B} were working at the {P} , {C} gave a {O} to",
    "Then , {A} and {B} had a long talk at the {P} . {C} passed the {O} to",
    "When {A} and {B} got a {O} at the {P} , {C} decided to give it to",
)
# More words, so that the vocabulary is a few hundred words and random sequences are not
# all names; they take part in the random sequences only.
FILLER = words(
    "red green blue black white old new big small long short happy sad quick slow warm cold "
    "dark light early late good bad young tall soft hard loud quiet open closed full empty "
    "run walk sing read write swim jump sleep eat cook play talk think look find take make "
    "see hear call ask tell keep hold bring carry build break throw catch draw paint push "
    "pull turn move stand sit wait stay leave meet help show try feel know learn teach "
    "dog cat bird fish horse cow sheep mouse tree leaf rain snow wind sun moon star sky "
    "road car boat train bus door window wall floor roof table chair bed desk paper stone "
    "water fire bread milk tea soup rice egg salt sugar day night week year morning evening "
    "summer winter spring autumn city town village house room field hill forest "
    "sea island world song story game word name idea question answer number picture"
)
SYMBOLS = [f"x{i:02d}" for i in range(64)]
SPECIALS = ("<bos>", "<pad>", "<unk>")


def vocabulary() -> list[str]:
    """Specials first, then every word once, in a fixed order."""
    seen: list[str] = []
    template_words = [w for t in TEMPLATES for w in t.split() if not w.startswith("{")]
    for word in [*NAMES, *PLACES, *OBJECTS, *template_words, *FILLER, *SYMBOLS]:
        if word not in seen:
            seen.append(word)
    return [*SPECIALS, *seen]


def build_tokenizer(vocab: list[str]) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` that puts <bos> before every text."""
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    ids = {word: i for i, word in enumerate(vocab)}
    tok = Tokenizer(WordLevel(ids, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(SPECIALS))
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", ids["<bos>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<bos>", pad_token="<pad>", unk_token="<unk>"
    )


# --- the data ------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """The run: model size, data mix, optimisation. Every field lands in the model card."""

    seed: int = 0
    steps: int = 3000
    d_model: int = 128
    layers: int = 2
    heads: int = 4
    mlp: int = 512
    context: int = 64
    batch_repeat: int = 32
    batch_ioi: int = 32
    min_half: int = 6
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    threads: int = 1
    eval_sequences: int = 200
    eval_half: int = 20
    eval_ioi: int = 500
    arch: str = "neox"  # neox (rotary on a quarter of each head), gpt2 (learned positions) or llama (rotary)
    rotary: float = 0.25  # neox: the share of each head's dimensions that rotary positions turn
    fill: str = "random"  # after the second copy: random words, or r again ("cycle")
    layout: str = "prr"  # the repeated sequences: <bos> p r r (prr) or <bos> p r m r f (prmrf)
    ioi_from: int = 1000  # the step at which the indirect-object batch joins (a curriculum)
    log_every: int = 500  # steps between the lines that stay, each with the held-out copies' losses
    pool: str = "all"  # the training runs' words: every non-special word, or the symbols alone

    def __post_init__(self) -> None:
        for name in ("steps", "d_model", "layers", "heads", "mlp", "batch_repeat", "batch_ioi", "threads", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.arch not in ("neox", "gpt2", "llama"):
            raise ValueError(f"--arch {self.arch!r} is not neox, gpt2 or llama")
        if not 0.0 < self.rotary <= 1.0:
            raise ValueError(f"--rotary {self.rotary} is not in (0, 1]")
        if self.pool not in ("all", "symbols"):
            raise ValueError(f"--pool {self.pool!r} is not all or symbols")
        if self.fill not in ("random", "cycle"):
            raise ValueError(f"--fill {self.fill!r} is not random or cycle")
        if self.layout not in ("prr", "prmrf"):
            raise ValueError(f"--layout {self.layout!r} is not prr or prmrf")
        if not 0 <= self.ioi_from < self.steps:
            raise ValueError(f"--ioi-from {self.ioi_from} is not a step of the run (0 to {self.steps - 1})")
        if self.d_model % self.heads:
            raise ValueError(f"--d-model {self.d_model} is not divisible by --heads {self.heads}")
        if self.context < 2 * self.min_half + 1 or self.context < 2 * self.eval_half + 1:
            raise ValueError(f"--context {self.context} is too short for the repeated sequences")


class Data:
    """Seeded batches of both tasks, as token ids (lists of ints)."""

    def __init__(self, vocab: list[str], rng: random.Random) -> None:
        self.ids = {word: i for i, word in enumerate(vocab)}
        # Random sequences draw from every word (as `attnviz heads --probe induction` does).
        self.pool = [i for word, i in self.ids.items() if word not in SPECIALS]
        self.rng = rng

    def repeated(self, half: int) -> list[int]:
        """<bos> r r with r ``half`` random tokens (the held-out form, as attnviz's probe)."""
        r = self.random(half)
        return [self.ids["<bos>"], *r, *r]

    def random(self, count: int) -> list[int]:
        return [self.rng.choice(self.pool) for _ in range(count)]

    def prefixed_repeat(self, length: int, min_half: int) -> list[int]:
        """<bos> p r r, at most ``length`` tokens: r (``min_half`` to (length−1)//2 tokens)
        seen twice in a row after a random prefix p of random length, so that neither where
        r starts nor how far back its first copy lies is fixed; the second copy is predicted
        only by finding the current token's earlier occurrence and copying the token after
        it. Rows are of different lengths (padded in the batch), and nothing random follows
        the second copy to dilute the loss."""
        half = self.rng.randint(min_half, (length - 1) // 2)
        before = self.rng.randint(0, length - 1 - 2 * half)
        r = self.random(half)
        return [self.ids["<bos>"], *self.random(before), *r, *r]

    def training_sequence(self, length: int, min_half: int, fill: str = "random") -> list[int]:
        """<bos> p r m r f, ``length`` tokens: r (``min_half`` to (length−1)//2 tokens) seen
        twice, p, m and f random, p and m of random lengths. Where r starts and how far apart
        the copies lie vary, so no rule of positions predicts the second copy (a model fed
        only <bos> r r learns "attend to half my position" instead of induction); only
        looking up the token after the current token's earlier occurrence does."""
        half = self.rng.randint(min_half, (length - 1) // 2)
        spare = length - 1 - 2 * half
        before = self.rng.randint(0, spare)
        between = self.rng.randint(0, spare - before)
        r = self.random(half)
        out = [self.ids["<bos>"], *self.random(before), *r, *self.random(between), *r]
        if fill == "cycle":  # r again and again: every token after the first copy is predictable
            return out + [r[i % half] for i in range(length - len(out))]
        return out + self.random(length - len(out))

    def ioi(self) -> tuple[list[int], int, int]:
        """(<bos> prompt…, indirect object id, subject id): the prompt ends before the answer."""
        a, b = self.rng.sample(NAMES, 2)
        io, s = (a, b) if self.rng.random() < 0.5 else (b, a)  # ABBA and BABA orders
        words = self.rng.choice(TEMPLATES).format(A=a, B=b, C=s, P=self.rng.choice(PLACES), O=self.rng.choice(OBJECTS))
        return [self.ids["<bos>"], *(self.ids[w] for w in words.split())], self.ids[io], self.ids[s]


def pad(rows: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    """(ids, labels) tensors (B, T): right-padded; labels are the next token, -100 on padding."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(row) - 1] = torch.tensor(row[1:])
    return ids, labels


# --- training ------------------------------------------------------------------------


def build_model(cfg: Config, vocab_size: int) -> Any:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    # Every architecture: the word-level vocabulary, <bos> (0) also ending a text, <pad> (1),
    # the unembedding tied to the token embeddings, no dropout.
    common = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, pad_token_id=1, tie_word_embeddings=True)
    if cfg.arch == "neox":
        return GPTNeoXForCausalLM(
            GPTNeoXConfig(
                hidden_size=cfg.d_model,
                intermediate_size=cfg.mlp,
                num_hidden_layers=cfg.layers,
                num_attention_heads=cfg.heads,
                max_position_embeddings=cfg.context,
                rotary_pct=cfg.rotary,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                **common,
            )
        )
    if cfg.arch == "llama":
        return LlamaForCausalLM(
            LlamaConfig(
                hidden_size=cfg.d_model,
                intermediate_size=cfg.mlp,
                num_hidden_layers=cfg.layers,
                num_attention_heads=cfg.heads,
                num_key_value_heads=cfg.heads,
                max_position_embeddings=cfg.context,
                **common,
            )
        )
    config = GPT2Config(
        n_positions=cfg.context,
        n_embd=cfg.d_model,
        n_layer=cfg.layers,
        n_head=cfg.heads,
        n_inner=cfg.mlp,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **common,
    )
    return GPT2LMHeadModel(config)


def lr_at(step: int, cfg: Config) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train(cfg: Config, progress: bool = True) -> tuple[Any, Any, dict[str, Any]]:
    """The trained model, its tokenizer and the training log (losses, times)."""
    import torch
    import torch.nn.functional as F

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    vocab = vocabulary()
    tokenizer = build_tokenizer(vocab)
    model = build_model(cfg, len(vocab))
    model.train()
    data = Data(vocab, random.Random(cfg.seed))
    if cfg.pool == "symbols":  # a small alphabet for the repeated runs (the evaluation keeps every word)
        data.pool = [data.ids[s] for s in SYMBOLS]
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    keep = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": keep, "weight_decay": 0.0}], lr=cfg.lr
    )
    pad_id = data.ids["<pad>"]
    # Sixteen <bos> r r from a generator of their own (training's draws are unchanged): the
    # log lines show the second copy's loss falling once induction forms.
    probe = Data(vocab, random.Random(cfg.seed + 7))
    held_out = [probe.repeated(cfg.eval_half) for _ in range(16)]
    log: list[dict[str, float]] = []
    wall, cpu = time.perf_counter(), time.process_time()
    bar = _progress(cfg.steps, enabled=progress)
    with bar:
        task = bar.add_task("training", total=cfg.steps, loss="-")
        for step in range(cfg.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            if cfg.layout == "prr":
                rep = [data.prefixed_repeat(cfg.context, cfg.min_half) for _ in range(cfg.batch_repeat)]
            else:
                rep = [data.training_sequence(cfg.context, cfg.min_half, cfg.fill) for _ in range(cfg.batch_repeat)]
            ioi = [p + [io] for p, io, _ in (data.ioi() for _ in range(cfg.batch_ioi))]
            loss = torch.zeros(())
            parts = [math.nan, math.nan]
            # Induction alone first: the indirect objects are learnt in a few hundred steps
            # and, summed in from the start, their gradient (clipped together) slowed the
            # repeats' plateau past the budget (the card lists those runs).
            for k, rows in enumerate((rep, ioi) if step >= cfg.ioi_from else (rep,)):
                ids, labels = pad(rows, pad_id)
                logits = model(input_ids=ids, attention_mask=(ids != pad_id).long()).logits  # (B, T, V)
                part = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
                parts[k] = float(part.detach())
                loss = loss + part
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % 50 == 0 or step == cfg.steps - 1:
                log.append({"step": step, "repeat": parts[0], "ioi": None if math.isnan(parts[1]) else parts[1]})
            if step % cfg.log_every == 0 or step == cfg.steps - 1:  # a line that stays (and shows in a log file)
                first, second = copy_losses(model, held_out)
                bar.console.log(
                    f"step {step}: loss repeat {parts[0]:.3f} · ioi {parts[1]:.3f} · held-out copies"
                    f" {first:.3f} / {second:.3f}"
                )
            bar.update(task, advance=1, loss=f"repeat {parts[0]:.3f} · ioi {parts[1]:.3f}")
    times = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    model.eval()
    return model, tokenizer, {"log": log, **times}


def copy_losses(model: Any, rows: list[list[int]]) -> tuple[float, float]:
    """Mean next-token loss (nats) predicting the first copy's tokens 2…h and the second
    copy's h+2…2h in ``rows`` (each <bos> r r, r of h tokens), without a gradient."""
    import torch

    ids = torch.tensor(rows)  # (B, T)
    half = (ids.shape[1] - 1) // 2
    with torch.no_grad():
        logp = model(input_ids=ids).logits.log_softmax(-1)  # (B, T, V)
    nll = -logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1): position p predicts p+1
    return float(nll[:, 1:half].mean()), float(nll[:, half + 1 :].mean())


def _progress(total: int, enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True, quiet=not enabled, width=None if sys.stderr.isatty() else 160)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[loss]}"),
        console=console,
    )


# --- evaluation ----------------------------------------------------------------------


def evaluate(model: Any, cfg: Config, seed: int) -> dict[str, Any]:
    """Held-out metrics, from a generator seeded apart from training's.

    in-context loss: mean next-token loss predicting r2…rL in the first copy and in the
    second copy of <bos> r r (``cfg.eval_half`` tokens, ``cfg.eval_sequences`` texts);
    the first copy is unpredictable (≈ log of the pool size), the second is induction.
    IOI: top-1 accuracy (the argmax over the whole vocabulary is the indirect object),
    the share with logit(IO) > logit(S), and the mean logit difference IO − S.
    Heads, on the same sequences: the one with the most weight on i−1 (previous token)
    and the one with the most weight on the token after the earlier occurrence (induction),
    as [layer, head], with that mean weight.
    """
    import torch

    vocab = vocabulary()
    data = Data(vocab, random.Random(seed))
    model.set_attn_implementation("eager")  # the weights themselves, for the head scores
    with torch.no_grad():
        rows = [data.repeated(cfg.eval_half) for _ in range(cfg.eval_sequences)]
        ids = torch.tensor(rows)
        out = model(input_ids=ids, output_attentions=True)
        logp = out.logits.log_softmax(-1)  # (B, T, V)
        att = torch.stack(out.attentions, 1)  # (B, N, H, T, T)
        q = torch.arange(2, ids.shape[1])
        previous = att[:, :, :, q, q - 1].mean((0, 3))  # (N, H): weight on i−1
        q2 = torch.arange(cfg.eval_half + 2, ids.shape[1])  # second copy: the token after the earlier occurrence
        induction = att[:, :, :, q2, q2 - cfg.eval_half + 1].mean((0, 3))  # (N, H)
        nll = -logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1): predicting token t+1
        half = cfg.eval_half
        # Position p predicts token p+1; the first copy is tokens 1..half, the second half+1..2half.
        first = nll[:, 1:half].mean()  # predicting tokens 2..half
        second = nll[:, half + 1 : 2 * half].mean()  # predicting tokens half+2..2half
        prompts = [data.ioi() for _ in range(cfg.eval_ioi)]
        top, right, diffs = 0, 0, []
        for prompt, io, s in prompts:
            logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
            top += int(int(logits.argmax()) == io)
            diff = float(logits[io] - logits[s])
            right += int(diff > 0)
            diffs.append(diff)
    heads = previous.shape[1]
    prev_at, ind_at = int(previous.argmax()), int(induction.argmax())
    return {
        "previous_head": [prev_at // heads, prev_at % heads],
        "previous_score": float(previous.max()),
        "induction_head": [ind_at // heads, ind_at % heads],
        "induction_score": float(induction.max()),
        "loss_first_copy": float(first),
        "loss_second_copy": float(second),
        "ioi_top1": top / len(prompts),
        "ioi_io_over_s": right / len(prompts),
        "ioi_logit_diff": sum(diffs) / len(diffs),
    }


# --- saving --------------------------------------------------------------------------


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def formed(metrics: dict[str, Any]) -> list[str]:
    """The card's verdict, from the held-out metrics alone."""
    induction = metrics["loss_second_copy"] < 0.5 * metrics["loss_first_copy"]
    ioi = metrics["ioi_io_over_s"] > 0.9
    return [
        "- induction: "
        + (
            "yes, the second copy of a random sequence is predicted in context (its loss below)."
            if induction
            else "no. The second copy of a random sequence is about as unpredictable as the first"
            " (losses below): no induction circuit formed in this run's budget, and the"
            " previous-token and induction heads named below are the argmax of weak scores, not"
            " circuits."
        ),
        "- indirect objects: "
        + (
            "yes, the indirect object is preferred to the repeated subject (accuracy and logit difference below)."
            if ioi
            else "no (accuracy and logit difference below)."
        ),
    ]


def card(cfg: Config, metrics: dict[str, Any], run: dict[str, Any], digest: str, params: int) -> str:
    """The model card (README.md in the model directory)."""
    import torch
    import transformers

    log = run["log"]
    lines = [
        f"# circuits-2l: a {cfg.layers}-layer {run['model_class']} trained on repeated sequences and indirect objects",
        "",
        "Trained by `samples/train_circuits.py` in the attnviz repository (the command below), on",
        "CPU, from a seeded synthetic mix; no download, no outside data. The tasks' mechanisms are",
        "known from the literature, so attnviz's detectors, ablation, patching and attribution have a",
        "right answer to find (docs/circuits.md walks through both circuits).",
        "",
        "## What formed",
        "",
        *formed(metrics),
        "",
        "## Command",
        "",
        "```",
        "python samples/train_circuits.py " + " ".join(run["argv"]),
        "```",
        "",
        "## Model",
        "",
        f"{run['model_class']}, {cfg.layers} layers × {cfg.heads} heads, d_model {cfg.d_model}, MLP {cfg.mlp},",
        f"context {cfg.context} tokens, {POSITIONS[cfg.arch].format(share=cfg.rotary)}, tied embeddings, no dropout;",
        f"{params:,} parameters, float32.",
        f"Vocabulary: {len(vocabulary())} words (word-level `tokenizer.json`, `<bos>` put before every",
        f"text): {len(NAMES)} names, {len(PLACES)} places, {len(OBJECTS)} objects, the templates' words,",
        f"{len(FILLER)} other words and {len(SYMBOLS)} symbols `x00`…`x{len(SYMBOLS) - 1:02d}`.",
        "",
        "## Data (seeded, generated on the fly)",
        "",
        f"Each step: {cfg.batch_repeat} sequences of "
        + (
            f"at most {cfg.context} tokens `<bos> p r r` (r: {cfg.min_half} to"
            if cfg.layout == "prr"
            else f"{cfg.context} tokens `<bos> p r m r f` (r: {cfg.min_half} to"
        ),
        f"{(cfg.context - 1) // 2} tokens seen twice; "
        + ("p random, of random length" if cfg.layout == "prr" else "p, m and f random, p and m of random lengths")
        + "; every token",
        (
            "drawn uniformly from every non-special word)"
            if cfg.pool == "all"
            else f"drawn uniformly from the {len(SYMBOLS)} symbols; the evaluation below draws from every word)"
        )
        + f" and {cfg.batch_ioi} indirect-object sentences from",
        f"{len(TEMPLATES)} templates, e.g. `When Mary and John went to the store , John gave a drink to Mary`",
        "(the subject repeated, the other name the answer; both name orders)."
        + (" With `--fill cycle` f is r again, to the end." if cfg.fill == "cycle" and cfg.layout == "prmrf" else "")
        + " The loss is next-token",
        "cross-entropy on every token of both, summed"
        + (f"; the indirect objects join at step {cfg.ioi_from} (the repeats alone before)." if cfg.ioi_from else "."),
        "",
        "## Training",
        "",
        f"{cfg.steps} steps, AdamW (lr {cfg.lr}, {cfg.warmup} warm-up steps, cosine to a tenth, weight decay",
        f"{cfg.weight_decay} on matrices, gradient clip 1.0), seed {cfg.seed}, {cfg.threads} torch thread(s),",
        "deterministic algorithms.",
        "",
        f"- wall time: {run['wall_s']:.0f} s; CPU time of the process: {run['cpu_s']:.0f} s",
        f"  (on {run['machine']}; the machine was shared with other jobs, so the wall time is an upper bound)",
        f"- torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}",
        f"- loss at step 0: repeat {log[0]['repeat']:.3f}, IOI {_nats(log[0]['ioi'])}; at the last step: repeat",
        f"  {log[-1]['repeat']:.3f}, IOI {_nats(log[-1]['ioi'])}",
        "",
        "## Final metrics (held-out data, seeded apart from training)",
        "",
        f"- in-context loss on `<bos> r r`, r of {cfg.eval_half} tokens, {cfg.eval_sequences} sequences: first copy",
        f"  {metrics['loss_first_copy']:.3f} nats (unpredictable: ln {len(vocabulary()) - len(SPECIALS)} ="
        f" {math.log(len(vocabulary()) - len(SPECIALS)):.3f}), second copy {metrics['loss_second_copy']:.3f} nats",
        f"- previous-token head: layer {metrics['previous_head'][0]} head {metrics['previous_head'][1]}, mean weight"
        f" {metrics['previous_score']:.3f} on i−1;",
        f"  induction head: layer {metrics['induction_head'][0]} head {metrics['induction_head'][1]}, mean weight"
        f" {metrics['induction_score']:.3f} on the token after the earlier occurrence (second copy)",
        f"- indirect objects, {cfg.eval_ioi} prompts: top-1 accuracy {metrics['ioi_top1']:.3f} (over the whole",
        f"  vocabulary), logit(IO) > logit(S) on {metrics['ioi_io_over_s']:.3f}, mean logit difference",
        f"  IO − S {metrics['ioi_logit_diff']:.3f}",
        "",
        "## Files",
        "",
        "`config.json`, `model.safetensors`, `generation_config.json`, `tokenizer.json`,",
        "`tokenizer_config.json`, this card.",
        "",
        f"sha256(model.safetensors) = {digest}",
        "",
    ]
    return "\n".join(lines)


POSITIONS = {
    "neox": "rotary positions on {share:.0%} of each head's dimensions (the rest compare content alone),"
    " attention and MLP in parallel on each layer's input (GPT-NeoX's parallel residual)",
    "gpt2": "learned absolute positions",
    "llama": "rotary positions on every dimension",
}


def _nats(loss: float | None) -> str:
    return "- (not yet in the mix)" if loss is None else f"{loss:.3f}"


def save(model: Any, tokenizer: Any, out: Path, cfg: Config, metrics: dict[str, Any], run: dict[str, Any]) -> str:
    """Write the checkpoint and its card to ``out`` whole (a temporary sibling renamed)."""
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)
        digest = sha256(tmp / "model.safetensors")
        params = sum(p.numel() for p in model.parameters())
        (tmp / "README.md").write_text(card(cfg, metrics, run, digest, params), encoding="utf-8")
        (tmp / "metrics.json").write_text(json.dumps({"metrics": metrics, "log": run["log"]}, indent=1) + "\n")
        for path in tmp.iterdir():
            path.chmod(0o644)
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}-old-{os.getpid()}")
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return digest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "circuits-2l")
    defaults = Config()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        cfg = Config(**{k: getattr(args, k) for k in asdict(defaults)})
    except ValueError as exc:
        print(f"train_circuits: {exc}", file=sys.stderr)
        return 2
    model, tokenizer, run = train(cfg, progress=not args.quiet)
    metrics = evaluate(model, cfg, seed=cfg.seed + 1_000_003)
    shown = [a for a in argv if a != "--quiet"]
    run.update(
        argv=[a if not a.startswith("/") else "…" for a in shown], machine=_machine(), model_class=type(model).__name__
    )
    digest = save(model, tokenizer, args.out, cfg, metrics, run)
    print(
        json.dumps({"out": str(args.out), "sha256": digest, **metrics, "wall_s": run["wall_s"], "cpu_s": run["cpu_s"]})
    )
    return 0


def _machine() -> str:
    return f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs"


if __name__ == "__main__":
    sys.exit(main())
