"""What the reading options of issue 11 cost: `attnviz show` as a whole process, plain and
with every option (--words --hide-special --heads mean,max --rollout), interleaved in one
run, medians and their ratio. Rollout needs every row of every layer up to the last one
shown, so it is the option that could cost something; the transforms are numpy on
arrays of L × H × S × S floats.

    python bench/reading_bench.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = "The animal didn't cross the street because it was too tired"
ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
READING = ["--words", "--hide-special", "--heads", "mean,max", "--rollout"]

COMMANDS = {
    "show --token it": [ATTNVIZ, "show", EXAMPLE, "--token", "it"],
    "show --token it + all reading options": [ATTNVIZ, "show", EXAMPLE, "--token", "it", *READING],
    "show --all-tokens --json": [ATTNVIZ, "show", EXAMPLE, "--all-tokens", "--json"],
    "show --all-tokens --json + all reading options": [ATTNVIZ, "show", EXAMPLE, "--all-tokens", "--json", *READING],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for cmd in COMMANDS.values():  # warm the page cache once
        subprocess.run(cmd, env=env, capture_output=True, check=True)
    for _ in range(args.runs):
        for name, cmd in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(cmd, env=env, capture_output=True, check=True)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, m in med.items():
        print(f"{name:48s} median {m:6.3f} s  (min {min(times[name]):.3f}, n={args.runs})")
    names = list(COMMANDS)
    print(f"ratio with / without reading options (one token): {med[names[1]] / med[names[0]]:.2f}")
    print(f"ratio with / without reading options (all tokens): {med[names[3]] / med[names[2]]:.2f}")


if __name__ == "__main__":
    main()
