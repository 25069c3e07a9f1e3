"""One token's attention in a long prompt: attnviz against transformers and the floor.

A Llama-shaped decoder (hidden 256, 4 layers, 8 query heads over 2 key/value heads,
intermediate 512, max positions 32768, random weights; built with transformers'
LlamaConfig and saved with a word-level tokenizer made here, nothing downloaded), at
n = 512 ... 32768 tokens. Three columns, each measured as a whole subprocess (its
peak RSS from getrusage, its forward-pass time), all in one run:

    own    attnviz --engine own: the last token's rows, every layer (pipeline.run with Query(index=n-1))
    eager  transformers, eager attention, output_attentions=True, then the same rows
    floor  transformers, SDPA attention, no weights at all: the physical floor

Every subprocess runs under RLIMIT_AS (--cap-gb, default 8); a column whose estimate
exceeds the cap is not run and says what it would need. Then our MultiHeadAttention
module alone against torch.nn.MultiheadAttention(need_weights=True,
average_attn_weights=False) at n = 128, 512, 2048.

    python bench/long_context.py [--max-n 32768] [--cap-gb 8] [--plot bench/long_context.png]
                                 [--device cpu|cuda]

Timings on a busy shared machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, MAX_POSITIONS, VOCAB = 256, 4, 8, 2, 512, 32768, 1000
GB = 1024**3


def build_model(
    directory: Path,
    layers: int = LAYERS,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    max_positions: int = MAX_POSITIONS,
) -> Path:
    """The random Llama-shaped checkpoint and its tokenizer, saved in ``directory``
    (html_bench.py's 32 × 32/8 decoder is this one with more layers and heads)."""
    import torch
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (directory / "config.json").is_file():
        return directory
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(VOCAB - 3)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(directory)
    return directory


def text_of(n: int) -> str:
    """n - 1 words: with the <s> the tokenizer adds, n tokens."""
    return " ".join(f"w{(i * 7919) % (VOCAB - 3)}" for i in range(n - 1))


def estimate_gb(mode: str, n: int) -> float:
    """What a column needs beyond the ~0.5 GB of the process: eager keeps every layer's
    (H, n, n) float32 weights, and builds scores, a float mask and the softmax besides."""
    if mode == "eager":
        return (LAYERS * HEADS * n * n * 4 + 3 * HEADS * n * n * 4 + n * n * 4) / GB + 0.6
    return 0.6 + n * 60_000 / GB  # activations: a few (n, 512) tensors per layer


# --- workers: one measurement per process ------------------------------------------


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB  # ru_maxrss is KiB on Linux


def worker(mode: str, n: int, model_dir: str, device: str, reps: int) -> dict[str, Any]:
    """One column at one length; the time is the best of ``reps`` forward passes."""
    import torch

    cuda = device.startswith("cuda")
    if mode == "own":
        from attnviz.engines import load_engine
        from attnviz.pipeline import Selection, run
        from attnviz.select import Query

        eng = load_engine("own", model_dir, device)
        tokens = eng.tokenize(text_of(n))
        assert len(tokens) == n, len(tokens)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        seconds = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            att = run(tokens, eng, Selection(queries=(Query(index=n - 1),))).attention
            if cuda:
                torch.cuda.synchronize()
            seconds = min(seconds, time.perf_counter() - start)
        shape = tuple(att.weights.shape)
    else:
        from transformers import AutoModel, AutoTokenizer

        impl = "eager" if mode == "eager" else "sdpa"
        model = AutoModel.from_pretrained(model_dir, attn_implementation=impl).to(device).eval()
        ids = AutoTokenizer.from_pretrained(model_dir)(text_of(n), return_tensors="pt")["input_ids"].to(device)
        assert ids.shape[1] == n, ids.shape
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        seconds = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            with torch.inference_mode():
                out = model(input_ids=ids, output_attentions=mode == "eager")
                if mode == "eager":
                    rows = torch.stack([a[0, :, -1] for a in out.attentions])  # (layers, H, n)
                    shape = tuple(rows[:, :, None].shape)
                else:
                    shape = tuple(out.last_hidden_state.shape)
            if cuda:
                torch.cuda.synchronize()
            seconds = min(seconds, time.perf_counter() - start)
            del out
    result = {"mode": mode, "n": n, "seconds": seconds, "peak_rss_gb": _peak_rss_gb(), "shape": shape}
    if cuda:
        result["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / GB
    return result


def run_worker(
    mode: str, n: int, model_dir: Path, cap_gb: float, device: str, reps: int, threads: int
) -> dict[str, Any]:
    def limit() -> None:
        cap = int(cap_gb * GB)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    cmd = [sys.executable, __file__, "--worker", mode, str(n), str(model_dir), "--device", device, "--reps", str(reps)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if threads:
        # On a busy shared machine a thread pool's barrier waits for a descheduled thread:
        # one thread each gives the same conditions to every column, and steadier times.
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, env=env)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"mode": mode, "n": n, "error": f"exit {proc.returncode}: {last[:160]}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --- the module alone ----------------------------------------------------------------


def module_bench(lengths: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    """Our MultiHeadAttention (eager: every weight, as nn.MultiheadAttention returns) against
    torch's, with the same weights, E = 256, 8 heads, batch 1; median of ``reps`` after a warm-up."""
    import torch
    from torch import nn

    from attnviz.nn.attention import MultiHeadAttention
    from attnviz.nn.rows import EAGER

    out = []
    for n in lengths:
        torch.manual_seed(0)
        theirs = nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True).eval()
        ours = MultiHeadAttention(HIDDEN, HEADS).eval()
        with torch.no_grad():
            for proj, w, b in zip(
                (ours.q_proj, ours.k_proj, ours.v_proj),
                theirs.in_proj_weight.chunk(3),
                theirs.in_proj_bias.chunk(3),
                strict=True,
            ):
                proj.weight.copy_(w)
                proj.bias.copy_(b)
            ours.o_proj.weight.copy_(theirs.out_proj.weight)
            ours.o_proj.bias.copy_(theirs.out_proj.bias)
        x = torch.randn(1, n, HIDDEN)

        def t_theirs(theirs: Any = theirs, x: Any = x) -> Any:
            return theirs(x, x, x, need_weights=True, average_attn_weights=False)

        def t_ours(ours: Any = ours, x: Any = x) -> Any:
            return ours(x, request=EAGER)  # every weight, as the models ask (cache-blocked on CPU)

        times: dict[str, list[float]] = {"ours": [], "torch": []}
        with torch.inference_mode():
            a, b = t_ours(), t_theirs()
            diff = float((a[1] - b[1]).abs().max())
            for _ in range(reps):  # interleaved: both see the same machine load
                for name, fn in (("ours", t_ours), ("torch", t_theirs)):
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        out.append({"n": n, "ours_s": med["ours"], "torch_s": med["torch"], "max_weight_diff": diff})
    return out


# --- the report ---------------------------------------------------------------------


def plot(results: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    for ax, key, label in zip(
        fig.subplots(1, 2), ("peak_rss_gb", "seconds"), ("peak RSS (GB)", "forward time (s)"), strict=True
    ):
        for mode, style in (("own", "o-"), ("eager", "s--"), ("floor", "^:")):
            pts = [(r["n"], r[key]) for r in results if r["mode"] == mode and key in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=mode)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens n")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("Llama-shaped decoder (4 layers, 8/2 heads): one token's rows, all layers (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "N", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--min-n", type=int, default=512)
    parser.add_argument("--max-n", type=int, default=32768)
    parser.add_argument("--cap-gb", type=float, default=8.0, help="RLIMIT_AS of each subprocess")
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "attnviz-long-context-model")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    parser.add_argument("--module-reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each column (0: torch's default)")
    parser.add_argument("--reps", type=int, default=3, help="forward passes per column up to 8192 tokens (best kept)")
    args = parser.parse_args()
    if args.worker:
        mode, n, model_dir = args.worker
        print(json.dumps(worker(mode, int(n), model_dir, args.device, args.reps)))
        return
    model_dir = build_model(args.model_dir)
    lengths = []
    n = args.min_n
    while n <= args.max_n:
        lengths.append(n)
        n *= 2
    results: list[dict[str, Any]] = []
    print(f"{'n':>6} {'column':>6} {'peak RSS':>9} {'time':>8}", flush=True)
    for n in lengths:
        for mode in ("floor", "own", "eager"):
            need = estimate_gb(mode, n)
            if need > args.cap_gb:
                r = {"mode": mode, "n": n, "skipped": f"not run (would need {need:.0f} GB)"}
            else:
                # One pass where a pass takes minutes (and for eager beyond 2048 tokens).
                reps = 1 if n > 8192 or (mode == "eager" and n > 2048) else args.reps
                r = run_worker(mode, n, model_dir, args.cap_gb, args.device, reps, args.threads)
            results.append(r)
            if "seconds" in r:
                gpu = f"  gpu {r['peak_gpu_gb']:.2f} GB" if "peak_gpu_gb" in r else ""
                print(f"{n:>6} {mode:>6} {r['peak_rss_gb']:>7.2f} GB {r['seconds']:>7.2f}s{gpu}", flush=True)
            else:
                print(f"{n:>6} {mode:>6} {r.get('skipped') or r.get('error')}", flush=True)
    print("\nratios to the floor (same run):")
    print(f"{'n':>6} {'own mem':>8} {'own time':>9} {'eager mem':>10} {'eager time':>11}")
    by = {(r["mode"], r["n"]): r for r in results}
    for n in lengths:
        floor = by[("floor", n)]
        cells = []
        for mode in ("own", "eager"):
            r = by[(mode, n)]
            if "seconds" in r and "seconds" in floor:
                cells += [f"{r['peak_rss_gb'] / floor['peak_rss_gb']:.2f}", f"{r['seconds'] / floor['seconds']:.2f}"]
            else:
                cells += ["-", "-"]
        print(f"{n:>6} {cells[0]:>8} {cells[1]:>9} {cells[2]:>10} {cells[3]:>11}")
    print("\nMultiHeadAttention alone vs torch.nn.MultiheadAttention(need_weights=True, average_attn_weights=False):")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    module = module_bench((128, 512, 2048), args.module_reps)
    for m in module:
        print(
            f"n={m['n']:>5}: ours {m['ours_s'] * 1e3:8.2f} ms, torch {m['torch_s'] * 1e3:8.2f} ms, "
            f"ratio {m['ours_s'] / m['torch_s']:.2f} (max weight diff {m['max_weight_diff']:.1e})"
        )
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    if args.json:
        args.json.write_text(json.dumps({"columns": results, "module": module}, indent=1))


if __name__ == "__main__":
    main()
