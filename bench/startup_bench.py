"""How long `attnviz show` takes as a whole process, against `python -c "import torch"`.

The targets (issue 8): `attnviz show` <= 1.1 × `import torch`; `--help` and `--version`
<= 0.15 s (a bare interpreter start is printed beside them, for the machine's load).
Both commands run interleaved in one session (these machines are noisy), several times
each; we print the medians and their ratio. The hf engine is timed too, for contrast.

    python bench/startup_bench.py [--runs 7]
    python bench/startup_bench.py --trees BEFORE AFTER [--runs 9]   # two checkouts, interleaved

With ``--trees``, ``--help``, ``--version`` and ``show`` run with each directory first on
PYTHONPATH (e.g. ``git archive COMMIT | tar -x -C DIR``, then ``python -m compileall -q
DIR/attnviz`` so that neither side compiles its modules on every start), interleaved, and
the after/before ratios are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from attnviz.example import EXAMPLE

ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "attnviz --help": [ATTNVIZ, "--help"],
    "attnviz --version": [ATTNVIZ, "--version"],
    "import torch": [sys.executable, "-c", "import torch"],
    "attnviz show (own)": [ATTNVIZ, "show", EXAMPLE, "--token", "it"],
    "attnviz show (hf)": [ATTNVIZ, "show", EXAMPLE, "--token", "it", "--engine", "hf"],
}


def time_commands(commands: dict[str, list[str]], runs: int) -> dict[str, float]:
    """Each command's median wall time as a whole process: one warm-up each (the page
    cache), then ``runs`` rounds interleaved so that the machine's load hits all alike.
    Prints a line per command; also used by reading_bench.py."""
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for cmd in commands.values():
        subprocess.run(cmd, env=env, capture_output=True, check=True)
    for _ in range(runs):
        for name, cmd in commands.items():
            start = time.perf_counter()
            subprocess.run(cmd, env=env, capture_output=True, check=True)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    width = max(map(len, commands))
    for name, m in med.items():
        print(f"{name:{width}s} median {m:6.3f} s  (min {min(times[name]):.3f}, n={runs})")
    return med


def compare_trees(before: str, after: str, runs: int) -> None:
    """The start-up commands of two checkouts, interleaved, and their after/before ratios."""
    commands: dict[str, list[str]] = {}
    for side, root in (("before", before), ("after", after)):
        env = ["env", f"PYTHONPATH={os.path.abspath(root)}"]
        commands[f"{side} --help"] = [*env, ATTNVIZ, "--help"]
        commands[f"{side} --version"] = [*env, ATTNVIZ, "--version"]
        commands[f"{side} show (own)"] = [*env, ATTNVIZ, "show", EXAMPLE, "--token", "it"]
    commands["python -c pass"] = COMMANDS["python -c pass"]
    commands["import torch"] = COMMANDS["import torch"]
    med = time_commands(commands, runs)
    for what in ("--help", "--version", "show (own)"):
        print(f"{what}: after / before = {med['after ' + what] / med['before ' + what]:.3f}")
    for side in ("before", "after"):
        print(f"{side}: show (own) / import torch = {med[side + ' show (own)'] / med['import torch']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--trees", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two checkouts")
    args = parser.parse_args()
    if args.trees:
        compare_trees(*args.trees, args.runs)
        return
    med = time_commands(COMMANDS, args.runs)
    base = med["import torch"]
    print(f"ratio attnviz show (own) / import torch: {med['attnviz show (own)'] / base:.2f}")
    print(f"ratio attnviz show (hf)  / import torch: {med['attnviz show (hf)'] / base:.2f}")
    floor = med["python -c pass"]
    for name in ("attnviz --help", "attnviz --version"):
        print(f"{name}: {med[name]:.3f} s (target <= 0.15 s), {med[name] / floor:.1f} × a bare 'python -c pass'")


if __name__ == "__main__":
    main()
