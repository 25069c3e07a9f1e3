"""Peak memory of ``heads`` on one long text, beside its estimate (issue 38).

`attnviz heads` on one 8,183-token text took 9.7 GB (whole (1, H, S, S) matrices of every
layer, then float64 copies and each detector's (S, S) targets) and died. The own engine
now hands the detectors one block of query rows at a time; this measures what a scan of
one text of each length adds to a child process's RSS (sampled every 2 ms during the scan,
over the RSS just before it), beside ``engines.memory.estimate_scan`` and the size of one
layer's float64 matrices (S² · H · 8 bytes).

    python bench/scan_memory.py [--lengths 2048,4096,8183] [--engine own]

A tiny random Llama (2 layers, 4 heads of 16 dims, hidden 48) with room for the longest
text; the word-level tokenizer makes one token per word.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = """
import json, sys, time
from attnviz.corpus.scan import Scan, ScanOptions
from attnviz.corpus.sources import CorpusText
from attnviz.engines import load_engine, memory
from attnviz.corpus.detectors import DETECTORS
model, engine, words = sys.argv[1], sys.argv[2], int(sys.argv[3])
eng = load_engine(engine, model, "cpu")
text = " ".join(["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"][i % 10] for i in range(words))
n = len(eng.tokenize(text))
layers = tuple(range(eng.num_layers))
need = memory.estimate_scan(eng.shape, eng.sizes, 1, n, len(layers), len(DETECTORS)).total
import os, threading
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
before, top, done = rss(), [0], threading.Event()
def sample():
    while not done.is_set():
        top[0] = max(top[0], rss())
        time.sleep(0.002)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
t = time.perf_counter()
report = Scan(eng, ScanOptions(layers, max_memory=2**50)).run([CorpusText(text, "t:1")])
seconds = time.perf_counter() - t
done.set()
sampler.join()
peak = max(top[0], rss())
print(json.dumps({"tokens": n, "before": before, "peak": peak, "estimate": need, "seconds": seconds,
                  "heads": eng.num_heads, "texts": report.texts}))
"""


def child(model: Path, engine: str, words: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), engine, str(words)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,4096,8183")
    parser.add_argument("--engine", default="own")
    args = parser.parse_args()
    from tests.builders import SPECS_BY_NAME, copy_with_config, save_tiny

    lengths = [int(x) for x in args.lengths.split(",")]
    with tempfile.TemporaryDirectory(prefix="attnviz-scan-mem-") as scratch:
        base = save_tiny(SPECS_BY_NAME["llama"], Path(scratch) / "base")
        model = copy_with_config(base, Path(scratch) / "long", max_position_embeddings=max(lengths) + 16)
        print(f"engine {args.engine}; RSS sampled every 2 ms during the scan, over the RSS before it")
        print("| tokens | peak over the RSS before | estimate | S²·H·8 (one layer, float64) | peak / S²·H·8 | time |")
        print("|---|---|---|---|---|---|")
        for words in lengths:
            t = time.perf_counter()
            r = child(model, args.engine, words - 2)  # BOS and the words: ``words`` tokens
            over = max(0.0, r["peak"] - r["before"])
            matrix = r["tokens"] ** 2 * r["heads"] * 8
            print(
                f"| {int(r['tokens']):,} | {over / 2**20:,.0f} MiB | {r['estimate'] / 2**20:,.0f} MiB "
                f"| {matrix / 2**20:,.0f} MiB | {over / matrix:.3f} | {r['seconds']:.1f} s "
                f"({time.perf_counter() - t:.0f} s with loading) |"
            )


if __name__ == "__main__":
    main()
