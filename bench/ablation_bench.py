"""Head ablation's cost, as ratios measured in one run (the machine is shared and noisy).

1. ``attnviz compare EXAMPLE --token it --ablate`` against the same command without
   ``--ablate``, each as a whole process (target: at most 3x).
2. Throughput of the ablation itself (every head of every layer of the packaged model at
   the example, own engine, batched passes) against the naive way, beside it here: L·H
   transformers forward passes, one per head, each zeroing that head's slice with a
   forward pre-hook on the layer's output projection (target: at least 5x).

Both sides of each ratio run on one thread, interleaved, medians of ``--runs``.

    python bench/ablation_bench.py --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from startup_bench import time_commands  # noqa: E402

from attnviz.example import EXAMPLE  # noqa: E402

COMMANDS = {
    "compare": ["attnviz", "compare", EXAMPLE, "--token", "it", "--no-pager", "--device", "cpu"],
    "compare --ablate": ["attnviz", "compare", EXAMPLE, "--token", "it", "--ablate", "--no-pager", "--device", "cpu"],
}


def naive_loop(model: object, ids: object, heads: int, layers: int) -> list[float]:
    """L·H transformers passes, one head zeroed in each by a pre-hook: the effects at "it"."""
    import torch

    clean = model(input_ids=ids).last_hidden_state[0, 10]  # type: ignore[operator]
    out = []
    for layer in range(layers):
        module = model.encoder.layer[layer].attention.output.dense  # type: ignore[attr-defined]
        for head in range(heads):

            def zero(mod: object, args: tuple[torch.Tensor, ...], head: int = head) -> tuple[torch.Tensor, ...]:
                x = args[0].clone()
                d = x.shape[-1] // heads
                x[..., head * d : (head + 1) * d] = 0.0
                return (x, *args[1:])

            handle = module.register_forward_pre_hook(zero)
            ablated = model(input_ids=ids).last_hidden_state[0, 10]  # type: ignore[operator]
            handle.remove()
            out.append(float(1 - torch.nn.functional.cosine_similarity(clean, ablated, dim=0)))
    return out


def throughput(runs: int) -> None:
    import torch
    from transformers import AutoModel

    from attnviz.engines import load_engine
    from attnviz.measures.ablation import Runner, ablate_text

    torch.set_num_threads(1)
    engine = load_engine("own", None, "cpu")
    tokens = engine.tokenize(EXAMPLE)
    model = AutoModel.from_pretrained(str(engine.files.path), attn_implementation="eager").eval()
    ids = torch.tensor([tokens.ids])
    ours, naive = [], []
    with torch.inference_mode():
        ablate_text(Runner(engine, tokens))  # warm-up both
        naive_loop(model, ids, 12, 6)
        for _ in range(runs):
            start = time.perf_counter()
            got = ablate_text(Runner(engine, tokens)).at(10)
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            ref = naive_loop(model, ids, 12, 6)
            naive.append(time.perf_counter() - start)
    diff = max(abs(a - b) for a, b in zip(got.ravel(), ref, strict=True))
    o, n = statistics.median(ours), statistics.median(naive)
    print(f"72 heads ablated, own engine batched (6 passes): median {o:.3f} s (min {min(ours):.3f}, n={runs})")
    print(f"72 heads ablated, naive transformers loop (72 passes): median {n:.3f} s (min {min(naive):.3f}, n={runs})")
    print(f"max |effect difference| {diff:.2e}")
    print(f"ratio throughput batched / naive: {n / o:.2f} (target >= 5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    med = time_commands(COMMANDS, args.runs)
    ratio = med["compare --ablate"] / med["compare"]
    print(f"ratio compare --ablate / compare (whole process): {ratio:.2f} (target <= 3)")
    throughput(args.runs)


if __name__ == "__main__":
    main()
