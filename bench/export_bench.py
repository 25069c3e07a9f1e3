"""Time `attnviz export` of the example's token view against the naive script, as whole processes.

Both draw the 6-layer × 12-head token view of the example sentence for "it" to a PNG.
Runs are paired and interleaved (attnviz, naive, attnviz, naive, ...) after one untimed
warm-up each, so a busy machine slows both alike; prints each median and the ratio
(target: attnviz / naive ≤ 0.4, issue 26). With ``--baseline DIR`` a third command, the
same entry point with ``PYTHONPATH=DIR`` (another checkout's ``attnviz/``, e.g.
``git archive main attnviz | tar -x -C DIR``), is timed in the same rounds: the change
between two versions of the code, paired against the same naive runs.

The processes run without PYTHONDONTWRITEBYTECODE, so the warm-up leaves .pyc files for
attnviz as ``pip install`` does for it and for transformers (this machine's shells set it:
attnviz then compiled its ~100 modules from source on every run, 0.3-0.5 s, while the naive
script's site-packages were precompiled).

    python bench/export_bench.py [--reps 5] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnviz.example import EXAMPLE
from attnviz.io.models import resolve

HERE = Path(__file__).resolve().parent


CPU: list[float] = []  # each timed run's CPU time (user + sys of the child), in order


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="timed runs of each (after one warm-up)")
    parser.add_argument("--baseline", metavar="DIR", help="also time attnviz imported from DIR/attnviz, paired")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    base_env = None
    if args.baseline:
        base_env = {**env, "PYTHONPATH": str(Path(args.baseline).resolve())}
    # The installed entry point, as a user runs it; next to this interpreter in a venv.
    exe = Path(sys.executable).with_name("attnviz")
    entry = [str(exe)] if exe.exists() else [shutil.which("attnviz") or "attnviz"]
    model_dir = str(resolve(None).path)
    with tempfile.TemporaryDirectory() as tmp:
        ours = [*entry, "export", EXAMPLE, "--token", "it", "-o", f"{tmp}/attnviz.png", "--device", "cpu"]
        naive = [sys.executable, str(HERE / "naive_export.py"), model_dir, f"{tmp}/naive.png"]
        timed(ours, env), timed(naive, env)  # warm-up: page cache, font cache, .pyc files
        if base_env is not None:
            timed(ours, base_env)
        a: list[float] = []
        b: list[float] = []
        c: list[float] = []
        cpu: dict[str, list[float]] = {"attnviz": [], "naive": [], "baseline": []}
        for _ in range(args.reps):
            for name, times, cmd, cmd_env in (
                ("attnviz", a, ours, env),
                ("naive", b, naive, env),
                ("baseline", c, ours, base_env),
            ):
                if cmd_env is not None:
                    times.append(timed(cmd, cmd_env))
                    cpu[name].append(CPU[-1])
    # CPU time (user + sys): steadier than wall time on a machine shared with other jobs.
    for name, values in cpu.items():
        if values:
            print(f"{name} CPU time: median {statistics.median(values):.2f} s")
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"attnviz export: median {ma:.2f} s  ({' '.join(f'{x:.2f}' for x in a)})")
    print(f"naive script:   median {mb:.2f} s  ({' '.join(f'{x:.2f}' for x in b)})")
    print(f"ratio attnviz/naive: {ma / mb:.2f}  (target <= 0.4)")
    if c:
        mc = statistics.median(c)
        print(f"baseline {args.baseline}: median {mc:.2f} s  ({' '.join(f'{x:.2f}' for x in c)})")
        paired = statistics.median(x / y for x, y in zip(a, c, strict=True))
        paired_cpu = statistics.median(x / y for x, y in zip(cpu["attnviz"], cpu["baseline"], strict=True))
        print(
            f"ratio baseline/naive: {mc / mb:.2f}; attnviz/baseline, paired median: {paired:.3f} wall, "
            f"{paired_cpu:.3f} CPU"
        )


if __name__ == "__main__":
    main()
