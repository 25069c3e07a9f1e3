"""Our MultiHeadAttention against torch.nn.MultiheadAttention(need_weights=True,
average_attn_weights=False): same weights, both returning every head's full weights.

E = 256, 8 heads (head dim 32: 1/√32 is not a power of two, so no scale folds into q
exactly), batch 1, self-attention, float32, one thread, n = 128, 512, 2048. Each rep
times the two back to back (the order alternating), so a busy machine hits both alike;
prints the median times and the median of the paired ratios, by the calling thread's CPU
time (with one torch thread all the work runs there; on a machine oversubscribed by other
jobs wall time mostly measures waiting for a core) and by wall time. Target: ratio <= 1.0.

    python bench/module_bench.py [--reps 21] [--lengths 128,512,2048] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

HIDDEN, HEADS = 256, 8


def pair(n: int, hidden: int = HIDDEN, heads: int = HEADS) -> tuple[Any, Any, Any]:
    """(ours, torch's, x): the two modules with the same weights, and an input (1, n, E)."""
    import torch
    from torch import nn

    from attnviz.attention import MultiHeadAttention

    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(hidden, heads, batch_first=True).eval()
    ours = MultiHeadAttention(hidden, heads).eval()
    with torch.no_grad():
        for proj, w, b in zip(
            (ours.q_proj, ours.k_proj, ours.v_proj), theirs.in_proj_weight.chunk(3), theirs.in_proj_bias.chunk(3),
            strict=True,
        ):  # fmt: skip
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        ours.o_proj.weight.copy_(theirs.out_proj.weight)
        ours.o_proj.bias.copy_(theirs.out_proj.bias)
    return ours, theirs, torch.randn(1, n, hidden)


def bench(n: int, reps: int) -> dict[str, float]:
    import torch

    ours, theirs, x = pair(n)

    def run_ours() -> Any:
        return ours(x)

    def run_theirs() -> Any:
        return theirs(x, x, x, need_weights=True, average_attn_weights=False)

    times: dict[str, list[float]] = {"ours": [], "torch": []}
    ratios: list[float] = []
    wall_ratios: list[float] = []
    with torch.inference_mode():
        a, b = run_ours(), run_theirs()  # warm-up, and the check that both compute the same
        diff = float((a[1] - b[1]).abs().max())
        for rep in range(reps):
            order = (("ours", run_ours), ("torch", run_theirs))
            took: dict[str, float] = {}
            wall: dict[str, float] = {}
            for name, fn in order if rep % 2 == 0 else order[::-1]:
                start, cpu = time.perf_counter(), time.thread_time()
                fn()
                took[name] = time.thread_time() - cpu
                wall[name] = time.perf_counter() - start
                times[name].append(took[name])
            ratios.append(took["ours"] / took["torch"])
            wall_ratios.append(wall["ours"] / wall["torch"])
    return {
        "n": n,
        "ours": statistics.median(times["ours"]),
        "torch": statistics.median(times["torch"]),
        "ratio": statistics.median(ratios),
        "wall_ratio": statistics.median(wall_ratios),
        "diff": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--lengths", default="128,512,2048")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.reps} paired reps")
    print("| n | ours (CPU time) | torch (CPU time) | paired ratio, CPU time | paired ratio, wall | max weight diff |")
    print("|---|---|---|---|---|---|")
    for n in (int(v) for v in args.lengths.split(",")):
        r = bench(n, args.reps)
        print(
            f"| {n:,} | {r['ours'] * 1e3:.2f} ms | {r['torch'] * 1e3:.2f} ms | **{r['ratio']:.3f}** "
            f"| {r['wall_ratio']:.3f} | {r['diff']:.1e} |"
        )


if __name__ == "__main__":
    main()
