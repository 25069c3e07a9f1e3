"""`attnviz heads` against a naive loop, and its memory against the corpus size.

1. Throughput on 2,000 generated sentences (the minimal pairs of samples/ plus sentences
   from templates, seeded), packaged all-MiniLM-L6-v2 on the CPU, all layers and all nine
   detectors: `attnviz heads CORPUS --json` against bench/naive_heads.py (transformers
   eager, output_attentions one sentence at a time, numpy scores). Both are whole
   processes; each reports the seconds of its scan loop (model loading excluded), so the
   ratio compares texts/s of the work itself. Target: attnviz ≥ 3× the naive texts/s.
   The two results' means are compared too (they compute the same definitions).
2. Peak RSS of `attnviz heads` on 1,000 and on 10,000 texts (ru_maxrss of each child
   process). Target: within 10 % of each other.

Every child runs under RLIMIT_AS (--max-gb, default 8 GiB of address space).

    python bench/heads_bench.py [--texts 2000] [--rss 1000,10000] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PAIRS = HERE.parent / "samples" / "minimal_pairs.tsv"

SUBJECTS = [
    "the animal",
    "the trophy",
    "my neighbour",
    "a small dog",
    "the teacher",
    "the old lamp",
    "Anna",
    "the committee",
    "a tired student",
    "the boat",
    "the city council",
    "the young programmer",
]
VERBS = ["crossed", "carried", "watched", "ignored", "repaired", "followed", "praised", "moved", "painted", "found"]
OBJECTS = [
    "the street",
    "the suitcase",
    "the bridge",
    "a heavy box",
    "the door",
    "her brother",
    "the report",
    "the red car",
    "an empty bottle",
    "the garden",
    "the new laptop",
    "the map",
]
TAILS = ["", " because it was too tired", " before the rain started", ", and then it stopped",
         " while the others waited outside", " although nobody had asked", " so that he could rest",
         ", which surprised everyone in the room", " until the sun went down over the hills", "!", "?",
         " in the morning, the afternoon and the evening"]  # fmt: skip


def sentences(count: int, seed: int = 0) -> list[str]:
    """The minimal pairs' sentences, then template sentences, ``count`` in all."""
    rng = random.Random(seed)
    out: list[str] = []
    for line in PAIRS.read_text(encoding="utf-8").splitlines()[4:]:
        out.extend(line.split("\t")[:2])
    while len(out) < count:
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(TAILS)}"
        if rng.random() < 0.3:  # a second clause: longer texts, repeated words
            s += f" and {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        out.append(s[0].upper() + s[1:] + ("" if s[-1] in "!?" else "."))
    return out[:count]


def run(cmd: list[str], max_gb: float) -> tuple[str, float]:
    """stdout and peak RSS (MiB) of ``cmd`` as a child under an address-space cap."""
    limit = int(max_gb * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, preexec_fn=cap)
        _, status, usage = os.wait4(proc.pid, 0)
        err = proc.stderr.read().decode() if proc.stderr else ""
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd[:4])} ... failed:\n{err[-2000:]}")
        out.seek(0)
        return out.read().decode(), usage.ru_maxrss / 1024  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--rss", default="1000,10000", help="corpus sizes for the peak-RSS runs ('' to skip)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-gb", type=float, default=8.0)
    args = parser.parse_args()
    from attnviz.io.models import packaged_model_dir

    model_dir = str(packaged_model_dir())
    ours = [sys.executable, "-m", "attnviz", "heads", "--json", "--device", "cpu", "--batch-size", str(args.batch_size)]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(sentences(args.texts)) + "\n", encoding="utf-8")
        print(f"corpus: {args.texts} sentences, {corpus.stat().st_size} bytes; batch size {args.batch_size}")
        # 1. Throughput, one run each, interleaved: attnviz, naive.
        t0 = time.perf_counter()
        a_out, a_rss = run([*ours, str(corpus)], args.max_gb)
        a_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        b_out, b_rss = run([sys.executable, str(HERE / "naive_heads.py"), model_dir, str(corpus)], args.max_gb)
        b_wall = time.perf_counter() - t0
        a, b = json.loads(a_out), json.loads(b_out)
        a_rate, b_rate = a["texts"] / a["seconds"], b["texts"] / b["seconds"]
        print(
            f"attnviz heads: {a['texts']} texts in {a['seconds']:.1f} s = {a_rate:.1f} texts/s "
            f"(process {a_wall:.1f} s, peak RSS {a_rss:.0f} MiB)"
        )
        print(
            f"naive loop:    {b['texts']} texts in {b['seconds']:.1f} s = {b_rate:.1f} texts/s "
            f"(process {b_wall:.1f} s, peak RSS {b_rss:.0f} MiB)"
        )
        print(f"throughput ratio attnviz/naive: {a_rate / b_rate:.2f}  (target >= 3)")
        worst = 0.0
        for name, means in b["mean"].items():
            ours_m = np.zeros_like(np.array(means))
            for row in a["scores"]:
                if row["detector"] == name:
                    ours_m[row["layer"], row["head"]] = row["mean"]
            worst = max(worst, float(np.abs(ours_m - np.array(means)).max()))
        print(f"largest difference of any detector's mean between the two: {worst:.2e}")
        # 2. Peak RSS against corpus size.
        sizes = [int(x) for x in args.rss.split(",") if x.strip()]
        peaks = []
        for size in sizes:
            path = Path(tmp) / f"corpus{size}.txt"
            with path.open("w", encoding="utf-8") as handle:
                for s in sentences(size, seed=size):
                    handle.write(s + "\n")
            t0 = time.perf_counter()
            out, rss = run([*ours, str(path)], args.max_gb)
            peaks.append(rss)
            print(
                f"peak RSS at {size} texts: {rss:.0f} MiB ({json.loads(out)['texts']} texts, "
                f"{time.perf_counter() - t0:.0f} s)"
            )
        if len(peaks) >= 2:
            print(f"peak RSS ratio {sizes[-1]}/{sizes[0]} texts: {peaks[-1] / peaks[0]:.3f}  (target within 1.10)")


if __name__ == "__main__":
    main()
