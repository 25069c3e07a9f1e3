"""Time `attnviz export` of the example's token view against the naive script, as whole processes.

Both draw the 6-layer × 12-head token view of the example sentence for "it" to a PNG.
Runs are paired and interleaved (attnviz, naive, attnviz, naive, ...) after one untimed
warm-up each, so a busy machine slows both alike; prints each median and the ratio
(target: attnviz / naive ≤ 0.5).

    python bench/export_bench.py [--reps 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnviz.models import resolve

EXAMPLE = "The animal didn't cross the street because it was too tired"
HERE = Path(__file__).resolve().parent


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="timed runs of each (after one warm-up)")
    args = parser.parse_args()
    # The installed entry point, as a user runs it; next to this interpreter in a venv.
    exe = Path(sys.executable).with_name("attnviz")
    entry = [str(exe)] if exe.exists() else [shutil.which("attnviz") or "attnviz"]
    model_dir = str(resolve(None).path)
    with tempfile.TemporaryDirectory() as tmp:
        ours = [*entry, "export", EXAMPLE, "--token", "it", "-o", f"{tmp}/attnviz.png", "--device", "cpu"]
        naive = [sys.executable, str(HERE / "naive_export.py"), model_dir, f"{tmp}/naive.png"]
        timed(ours), timed(naive)  # warm-up: page cache, font cache, .pyc files
        a: list[float] = []
        b: list[float] = []
        for _ in range(args.reps):
            a.append(timed(ours))
            b.append(timed(naive))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"attnviz export: median {ma:.2f} s  ({' '.join(f'{x:.2f}' for x in a)})")
    print(f"naive script:   median {mb:.2f} s  ({' '.join(f'{x:.2f}' for x in b)})")
    print(f"ratio attnviz/naive: {ma / mb:.2f}  (target <= 0.5)")


if __name__ == "__main__":
    main()
