"""Our MultiHeadAttention against torch.nn.MultiheadAttention(need_weights=True,
average_attn_weights=False): same weights, both returning every head's full weights.

E = 256, 8 heads (head dim 32: 1/√32 is not a power of two, so no scale folds into q
exactly), batch 1, self-attention, float32, one thread, n = 128, 512, 2048. Each rep
times the two back to back (the order alternating), so a busy machine hits both alike;
prints the median times and the median of the paired ratios, by the calling thread's CPU
time (with one torch thread all the work runs there; on a machine oversubscribed by other
jobs wall time mostly measures waiting for a core) and by wall time. Target: ratio <= 1.0.

With ``--baseline DIR`` (a checkout's ``attnviz/nn/attention.py``, or ``attnviz/attention.py``
before the layout move, under DIR, e.g. from
``git archive main attnviz | tar -x -C DIR``) that version's module is timed in the same
reps too, and its paired ratio to today's is printed: a change measured against the code
before it, under the same load.

    python bench/module_bench.py [--reps 21] [--lengths 128,512,2048] [--threads 1] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

HIDDEN, HEADS = 256, 8


def baseline_class(root: str) -> tuple[Any, Any]:
    """MultiHeadAttention from ROOT/attnviz/nn/attention.py (ROOT/attnviz/attention.py in a
    checkout from before the layout move; torch and the stdlib only), and the request its
    models pass for every weight (that checkout's ``rows.EAGER`` where its eager steps live
    in rows.py, else None: its module's default). The directory is loaded as a package of
    its own, ``baseline_nn``, so that its relative imports (``from . import taps``) resolve
    there, not in the attnviz being measured."""
    found = [
        p
        for p in (Path(root) / "attnviz" / "nn" / "attention.py", Path(root) / "attnviz" / "attention.py")
        if p.exists()
    ]
    if not found:
        raise SystemExit(f"no attnviz/nn/attention.py under {root}")
    package = types.ModuleType("baseline_nn")
    package.__path__ = [str(found[0].parent)]
    sys.modules["baseline_nn"] = package

    def load(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(f"baseline_nn.{name}", found[0].parent / f"{name}.py")
        if spec is None or spec.loader is None:
            raise SystemExit(f"cannot load {name}.py under {root}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    attention = load("attention")
    rows = load("rows") if (found[0].parent / "rows.py").exists() and found[0].parent.name == "nn" else None
    request = getattr(rows, "EAGER", None) if rows is not None and hasattr(rows, "cache_blocked") else None
    return attention.MultiHeadAttention, request


def pair(n: int, hidden: int = HIDDEN, heads: int = HEADS, cls: Any = None) -> tuple[Any, Any, Any]:
    """(ours, torch's, x): the two modules with the same weights, and an input (1, n, E).
    ``cls``: our module's class (default: attnviz.nn.attention.MultiHeadAttention)."""
    import torch
    from torch import nn

    from attnviz.nn.attention import MultiHeadAttention

    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(hidden, heads, batch_first=True).eval()
    ours = (cls or MultiHeadAttention)(hidden, heads).eval()
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


def bench(n: int, reps: int, baseline: tuple[Any, Any] | None = None) -> dict[str, float]:
    import torch

    from attnviz.nn.rows import EAGER

    ours, theirs, x = pair(n)
    # Every weight as the models ask for it (rows.EAGER: the eager steps, cache-blocked on CPU).
    runs: dict[str, Any] = {
        "ours": lambda: ours(x, request=EAGER),
        "torch": lambda: theirs(x, x, x, need_weights=True, average_attn_weights=False),
    }
    if baseline is not None:
        before, _, _ = pair(n, cls=baseline[0])
        request = baseline[1]
        runs["before"] = (lambda: before(x)) if request is None else (lambda: before(x, request=request))
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {"ratio": [], "wall_ratio": [], "before_ratio": []}
    with torch.inference_mode():
        a, b = runs["ours"](), runs["torch"]()  # warm-up, and the check that both compute the same
        diff = float((a[1] - b[1]).abs().max())
        if baseline is not None:
            runs["before"]()
        for rep in range(reps):
            took: dict[str, float] = {}
            wall: dict[str, float] = {}
            for name in names[rep % len(names) :] + names[: rep % len(names)]:  # each first in turn
                start, cpu = time.perf_counter(), time.thread_time()
                runs[name]()
                took[name] = time.thread_time() - cpu
                wall[name] = time.perf_counter() - start
                times[name].append(took[name])
            ratios["ratio"].append(took["ours"] / took["torch"])
            ratios["wall_ratio"].append(wall["ours"] / wall["torch"])
            if baseline is not None:
                ratios["before_ratio"].append(took["ours"] / took["before"])
    result = {"n": n, "diff": diff, **{name: statistics.median(times[name]) for name in names}}
    return result | {key: statistics.median(values) for key, values in ratios.items() if values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--lengths", default="128,512,2048")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--baseline", default=None, help="a directory holding an older attnviz/nn/attention.py")
    args = parser.parse_args()
    import torch

    baseline = baseline_class(args.baseline) if args.baseline else None
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.reps} paired reps")
    extra = ("| before (CPU time) | today / before ", "|---|---") if baseline is not None else ("", "")
    print(
        "| n | ours (CPU time) | torch (CPU time) | paired ratio, CPU time | paired ratio, wall "
        f"{extra[0]}| max weight diff |"
    )
    print(f"|---|---|---|---|---{extra[1]}|---|")
    for n in (int(v) for v in args.lengths.split(",")):
        r = bench(n, args.reps, baseline)
        before = f"| {r['before'] * 1e3:.2f} ms | {r['before_ratio']:.3f} " if baseline is not None else ""
        print(
            f"| {n:,} | {r['ours'] * 1e3:.2f} ms | {r['torch'] * 1e3:.2f} ms | **{r['ratio']:.3f}** "
            f"| {r['wall_ratio']:.3f} {before}| {r['diff']:.1e} |"
        )


if __name__ == "__main__":
    main()
