"""Activation patching of every head: attnviz vs the naive loop, ratios in one run.

    python bench/patch_bench.py [--tokens 15 200] [--naive-heads 12] [--tl-python PYTHON]

A GPT-2-small-shaped random model (12 layers × 12 heads, hidden 768, vocabulary 50257,
``GPT2LMHeadModel``) is saved in a temporary directory with a word-level tokenizer. For a
clean/corrupted pair of each length (they differ in one token in the middle), every head's
z is patched clean → corrupted (denoise) with a logit-difference metric at the last
position:

    attnviz   ``measures.patching.patch_heads`` on the own engine: one batched pass per
              layer (its heads as one batch), the layers before it run once
    naive     transformers' eager GPT2LMHeadModel, one forward per head with a forward
              pre-hook on ``c_proj`` writing the clean run's slice (TransformerLens is not
              installed; its ``get_act_patch_attn_head_out_all_pos`` loops the same way)

With ``--tl-python`` (an interpreter where transformer-lens is installed, e.g. a venv of
its own: ``pip install torch==2.13.0 transformer-lens``), TransformerLens's
``patching.get_act_patch_attn_head_out_all_pos`` is timed too, on the same checkpoint
(TransformerLens 4 removed ``HookedTransformer``: its ``TransformerBridge`` in compatibility
mode), in a child process of that interpreter, and its effects are checked against
attnviz's; the issue's target is attnviz at least 2× faster with peak memory no higher.

The naive loop costs the same full forward for every head, whatever its layer, so it is
timed on ``--naive-heads`` heads spread over the layers and scaled to all 144 (said in the
output). Both sides run on one thread (the machine is shared), each in a child process of
its own, so its peak resident memory (``ru_maxrss``) is its own; the parent prints the
ratios and checks the two agree. The same child times attribution patching (every head's
linear estimate, measures/attrpatch.py) and direct logit attribution against one plain
forward pass.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = [f"w{i}" for i in range(1000)]


def build(directory: Path) -> None:
    import torch
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    vocab = {w: i for i, w in enumerate(["<|endoftext|>", "<unk>", *WORDS])}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|endoftext|>").save_pretrained(
        directory
    )


def texts(n: int) -> tuple[str, str]:
    clean = [WORDS[(7 * i) % len(WORDS)] for i in range(n)]
    corrupted = list(clean)
    corrupted[n // 2] = WORDS[(7 * (n // 2) + 1) % len(WORDS)]
    return " ".join(clean), " ".join(corrupted)


def run_ours(path: str, n: int) -> dict[str, object]:
    import numpy as np
    import torch

    from attnviz.engines import load_engine
    from attnviz.measures.lm import load_lm_head
    from attnviz.measures.patching import Metric, patch_heads

    torch.set_num_threads(1)
    engine = load_engine("own", path, "cpu")
    lm = load_lm_head(engine)
    clean, corrupted = (engine.tokenize(t) for t in texts(n))
    metric = Metric("logit-diff", 2, 3, "w0", "w1")
    patch_heads(engine, clean, corrupted, metric, lm=lm, layers=[11])  # warm-up
    start = time.perf_counter()
    result = patch_heads(engine, clean, corrupted, metric, lm=lm)
    seconds = time.perf_counter() - start
    # The peak so far is exact patching's (and the load's); attribution patching's backward
    # pass below keeps its graph and would raise it.
    patch_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # Attribution patching: every head's linear estimate from two passes and one backward.
    from attnviz.measures.attrpatch import attribution_patch

    start = time.perf_counter()
    estimate = attribution_patch(engine, clean, corrupted, metric, lm=lm)
    attribution = time.perf_counter() - start
    # Direct logit attribution against one plain forward pass (each the best of 3).
    from attnviz.measures.attribution import attribute

    def best(fn: object) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            times.append(time.perf_counter() - t0)
        return min(times)

    t0 = time.perf_counter()
    attribute(engine, clean, 2, 3, lm)  # the first call reads W^O and the final norm from the files
    first = time.perf_counter() - t0
    forward = best(lambda: engine.final_hidden(clean))
    dla = best(lambda: attribute(engine, clean, 2, 3, lm, lens=False))
    with_lens = best(lambda: attribute(engine, clean, 2, 3, lm))
    return {
        "seconds": seconds,
        "patch_rss_mb": patch_rss,
        "attribution": attribution,
        "attribution_r": float(np.corrcoef(result.effect.ravel(), estimate.effect.ravel())[0, 1]),
        "effect": result.effect.tolist(),
        "passes": result.passes,
        "forward": forward,
        "dla": dla,
        "dla_first": first,
        "with_lens": with_lens,
    }


def run_naive(path: str, n: int, heads: int) -> dict[str, object]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    vocab = {w: i + 2 for i, w in enumerate(WORDS)}
    clean, corrupted = ([vocab[w] for w in t.split()] for t in texts(n))
    layers, width = model.config.n_layer, model.config.n_embd
    d = width // model.config.n_head

    def logit_diff(ids: list[int], write: tuple[int, int, torch.Tensor] | None = None) -> float:
        handle = None
        if write is not None:
            layer, head, source = write

            def hook(_: object, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
                x = args[0].clone()
                x[0, :, head * d : (head + 1) * d] = source[:, head * d : (head + 1) * d]
                return (x, *args[1:])

            handle = model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook)
        try:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        finally:
            if handle is not None:
                handle.remove()
        return float(logits[2] - logits[3])

    concat: list[torch.Tensor] = []
    hooks = [
        model.transformer.h[n].attn.c_proj.register_forward_pre_hook(lambda _m, a: concat.append(a[0][0].clone()))
        for n in range(layers)
    ]
    with torch.no_grad():
        model(input_ids=torch.tensor([clean]))
    for h in hooks:
        h.remove()
    c, x = logit_diff(clean), logit_diff(corrupted)
    picked = [(k % layers, (k * 5) % model.config.n_head) for k in range(heads)]
    logit_diff(corrupted, (0, 0, concat[0]))  # warm-up
    start = time.perf_counter()
    effects = {}
    for layer, head in picked:
        effects[f"{layer}.{head}"] = (logit_diff(corrupted, (layer, head, concat[layer])) - x) / (c - x)
    seconds = time.perf_counter() - start
    return {"seconds": seconds * layers * model.config.n_head / heads, "timed_heads": heads, "effects": effects}


def run_tl(path: str, n: int) -> dict[str, object]:
    """TransformerLens's every-head patching on the same checkpoint (TransformerLens 4: the
    ``TransformerBridge`` over transformers' model, in HookedTransformer compatibility mode)."""
    import torch
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge

    torch.set_num_threads(1)
    model = TransformerBridge.boot_transformers(path, device="cpu")
    model.enable_compatibility_mode()
    vocab = {w: i + 2 for i, w in enumerate(WORDS)}
    clean, corrupted = (torch.tensor([[vocab[w] for w in t.split()]]) for t in texts(n))

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, 2] - logits[0, -1, 3]

    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
        c, x = float(metric(model(clean))), float(metric(model(corrupted)))
        start = time.perf_counter()
        raw = patching.get_act_patch_attn_head_out_all_pos(model, corrupted, cache, metric)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "effect": ((raw - x) / (c - x)).tolist()}


def child(args: argparse.Namespace) -> None:
    if args.side == "tl":
        out = run_tl(args.path, args.n)
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return
    out = run_ours(args.path, args.n) if args.side == "ours" else run_naive(args.path, args.n, args.naive_heads)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[15, 200])
    parser.add_argument("--naive-heads", type=int, default=12)
    parser.add_argument(
        "--tl-python", metavar="PYTHON", help="an interpreter with transformer-lens: time its patching too"
    )
    parser.add_argument("--side", choices=["ours", "naive", "tl"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        child(args)
        return
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        load = Path("/proc/loadavg").read_text().split()[0]
        print(f"GPT-2-small-shaped random model (12 × 12, hidden 768); load average {load}")
        for n in args.tokens:
            results = {}
            for side in ("ours", "naive"):
                done = subprocess.run(
                    [sys.executable, __file__, "--side", side, "--path", tmp, "--n", str(n),
                     "--naive-heads", str(args.naive_heads)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                results[side] = json.loads(done.stdout.strip().splitlines()[-1])
            if args.tl_python:
                done = subprocess.run(
                    [args.tl_python, __file__, "--side", "tl", "--path", tmp, "--n", str(n)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                tl, mine = json.loads(done.stdout.strip().splitlines()[-1]), results["ours"]
                gap = float(np.abs(np.array(tl["effect"]) - np.array(mine["effect"])).max())
                print(
                    f"{n:>4} tokens: TransformerLens get_act_patch_attn_head_out_all_pos {tl['seconds']:.2f} s, "
                    f"peak RSS {tl['peak_rss_mb']:.0f} MB | attnviz {mine['seconds']:.2f} s, peak RSS "
                    f"{mine['patch_rss_mb']:.0f} MB | speed-up {tl['seconds'] / mine['seconds']:.1f}x (target >= 2x), "
                    f"memory ratio {mine['patch_rss_mb'] / tl['peak_rss_mb']:.2f} (target <= 1) | max |effect diff| "
                    f"{gap:.1e}"
                )
            ours, naive = results["ours"], results["naive"]
            effect = np.array(ours["effect"])
            worst = max(
                abs(effect[int(k.split(".")[0]), int(k.split(".")[1])] - v) for k, v in naive["effects"].items()
            )
            print(
                f"{n:>4} tokens: attnviz {ours['seconds']:.2f} s ({ours['passes']} passes), peak RSS "
                f"{ours['patch_rss_mb']:.0f} MB | naive {naive['seconds']:.2f} s (timed on {naive['timed_heads']} "
                f"heads, scaled to 144), peak RSS {naive['peak_rss_mb']:.0f} MB | speed-up "
                f"{naive['seconds'] / ours['seconds']:.1f}x (target >= 10x), memory ratio "
                f"{ours['patch_rss_mb'] / naive['peak_rss_mb']:.2f} | max |effect diff| {worst:.1e}"
            )
            print(
                f"{n:>4} tokens: attribution patching (every head's estimate) {ours['attribution']:.2f} s: "
                f"{naive['seconds'] / ours['attribution']:.0f}x faster than the naive loop, "
                f"{ours['seconds'] / ours['attribution']:.1f}x faster than exact; "
                f"Pearson r with the exact effects {ours['attribution_r']:.3f}; peak RSS with it "
                f"{ours['peak_rss_mb']:.0f} MB"
            )
            print(
                f"{n:>4} tokens: DLA {ours['dla'] * 1000:.1f} ms vs one forward {ours['forward'] * 1000:.1f} ms: "
                f"{ours['dla'] / ours['forward']:.2f}x (target <= 1.3x); with the logit lens "
                f"{ours['with_lens'] / ours['forward']:.2f}x; first call (reads W^O and the final norm, "
                f"with the lens) {ours['dla_first'] * 1000:.1f} ms"
            )


if __name__ == "__main__":
    main()
