"""What the reading options of issue 11 cost: `attnviz show` as a whole process, plain and
with every option (--words --hide-special --heads mean,max --rollout), interleaved in one
run, medians and their ratio. Rollout needs every row of every layer up to the last one
shown, so it is the option that could cost something; the transforms are numpy on
arrays of L × H × S × S floats.

    python bench/reading_bench.py [--runs 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from startup_bench import time_commands  # bench/ is on sys.path: this script's folder

from attnviz.example import EXAMPLE

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
    med = time_commands(COMMANDS, args.runs)
    names = list(COMMANDS)
    print(f"ratio with / without reading options (one token): {med[names[1]] / med[names[0]]:.2f}")
    print(f"ratio with / without reading options (all tokens): {med[names[3]] / med[names[2]]:.2f}")


if __name__ == "__main__":
    main()
