"""`attnviz heads` and `show` beside one busy-loop process, paired with the naive scripts.

A user's machine is rarely idle. With one competing process on this 2-core machine the
default two-thread torch pool made `attnviz heads` 6.7x slower (2.1 s -> 14.0 s on 400
texts) while the naive loop lost far less; attnviz.nn.threads now chooses the thread count
from the work and the cores free at the time. This bench measures, as whole processes:

    heads        attnviz heads --json CORPUS (400 generated texts, bench/heads_bench.py's)
    naive heads  bench/naive_heads.py MODEL CORPUS (transformers eager, one text at a time)
    show         attnviz show EXAMPLE --token it
    naive show   bench/naive_show.py MODEL (transformers eager, output_attentions, printed)

each once quiet and once with one busy loop (`python -c "while True: pass"`, started
0.3 s before and killed after) beside it, the two runs back to back so that the
machine's other load hits both alike; ``--rounds`` rounds, medians. For the heads
commands the scan loop's own seconds (from their JSON) are reported too. Target:
attnviz loaded / quiet <= 1.5, and no worse than the naive script's ratio.

"Quiet" is relative on a shared machine: other jobs run beside both columns.

    python bench/load_bench.py [--rounds 3] [--texts 400]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from heads_bench import sentences  # noqa: E402

from attnviz.example import EXAMPLE  # noqa: E402


def run(cmd: list[str], busy: bool) -> tuple[float, float | None]:
    """(wall seconds, the scan loop's seconds when the output is heads JSON)."""
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        if spinner is not None:
            time.sleep(0.3)
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - start
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    scan = None
    if done.stdout.lstrip().startswith("{"):
        doc = json.loads(done.stdout)
        scan = doc.get("seconds") if isinstance(doc.get("seconds"), float) else None
    return wall, scan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, default=400)
    parser.add_argument("--only", default="", help="comma-separated subset of the command names")
    args = parser.parse_args()
    from attnviz.io.models import packaged_model_dir

    model_dir = str(packaged_model_dir())
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(sentences(args.texts)) + "\n", encoding="utf-8")
        py = sys.executable
        commands = {
            "heads": [py, "-m", "attnviz", "heads", "--json", "--device", "cpu", str(corpus)],
            "naive heads": [py, str(HERE / "naive_heads.py"), model_dir, str(corpus)],
            "show": [py, "-m", "attnviz", "show", EXAMPLE, "--token", "it", "--device", "cpu"],
            "naive show": [py, str(HERE / "naive_show.py"), model_dir],
        }
        if args.only:
            commands = {k: v for k, v in commands.items() if k in args.only.split(",")}
        for cmd in commands.values():  # warm-up: page cache, .pyc files
            run(cmd, busy=False)
        walls: dict[tuple[str, bool], list[float]] = {}
        scans: dict[tuple[str, bool], list[float]] = {}
        for r in range(args.rounds):
            for name, cmd in commands.items():
                for busy in (False, True):
                    wall, scan = run(cmd, busy)
                    walls.setdefault((name, busy), []).append(wall)
                    if scan is not None:
                        scans.setdefault((name, busy), []).append(scan)
            print(f"round {r + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    print(f"cores: {os.cpu_count()}, rounds: {args.rounds}, heads corpus: {args.texts} texts")
    print("| command | quiet | one busy loop | loaded / quiet |")
    print("|---|---|---|---|")
    for name in commands:
        q, b = statistics.median(walls[(name, False)]), statistics.median(walls[(name, True)])
        print(f"| {name} (process) | {q:.2f} s | {b:.2f} s | **{b / q:.2f}** |")
        if (name, False) in scans:
            qs, bs = statistics.median(scans[(name, False)]), statistics.median(scans[(name, True)])
            print(f"| {name} (scan loop) | {qs:.2f} s | {bs:.2f} s | **{bs / qs:.2f}** |")


if __name__ == "__main__":
    main()
