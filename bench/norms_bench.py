"""--measure norm against --measure weight, and explain against show, as ratios in one run.

1. The Llama-shaped long-input bench decoder of long_context.py (hidden 256, 4 layers, 8
   query heads over 2 key/value heads, random weights, built here, nothing downloaded):
   the last token's rows of every layer, ``inspect(..., measure=...)``, at 1,024 and 8,192
   tokens. Each (measure, n) runs in its own subprocess: its best forward time of --reps
   and its peak RSS (getrusage). Target: norm <= 1.15x weight in time and peak memory.
2. ``attnviz explain`` on the example against ``attnviz show`` of the same token and
   layer, as whole processes, interleaved: medians of the wall time and of the CPU time
   (user + system) of each process. Target: explain <= 1.1x show.

    python bench/norms_bench.py [--reps 3] [--runs 7] [--lengths 1024,8192] [--only measure|explain]

The machine is shared and busy: compare the ratios within one run, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from long_context import build_model, text_of  # noqa: E402

from attnviz.example import EXAMPLE  # noqa: E402

GB = 1024**3


def _rss_gb() -> float:
    """The resident set now (Linux /proc/self/statm), in GB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / GB


def worker(mode: str, n: int, model_dir: str, reps: int) -> dict[str, Any]:
    """mode "time": both measures in this process, interleaved rep by rep (the machine's
    load hits both alike), best and median of ``reps``; mode "weight"/"norm": one pass of
    that measure, its peak RSS and the peak above the RSS before the pass."""

    from attnviz.engines import inspect, load_engine

    eng = load_engine("own", model_dir, "cpu")
    tokens = eng.tokenize(text_of(n))
    assert len(tokens) == n, len(tokens)
    if mode != "time":
        before = _rss_gb()
        att = inspect(tokens, eng, "all", (n - 1,), measure=mode)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
        return {
            "measure": mode,
            "n": n,
            "peak_rss_gb": peak,
            "pass_gb": peak - before,
            "shape": list(att.weights.shape),
        }
    times: dict[str, list[float]] = {"weight": [], "norm": []}
    for measure in times:  # warm-up: first-call costs (allocator, the cached QR of W^O)
        inspect(tokens, eng, "all", (n - 1,), measure=measure)
    for _ in range(reps):
        for measure, seen in times.items():
            start = time.perf_counter()
            inspect(tokens, eng, "all", (n - 1,), measure=measure)
            seen.append(time.perf_counter() - start)
    return {
        "n": n,
        **{f"{m}_min": min(t) for m, t in times.items()},
        **{f"{m}_median": statistics.median(t) for m, t in times.items()},
    }


def run_worker(mode: str, n: int, model_dir: Path, reps: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", mode, str(n), str(model_dir), "--reps", str(reps)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--lengths", default="1024,8192")
    parser.add_argument("--worker", nargs=3, metavar=("MEASURE", "N", "DIR"))
    parser.add_argument("--only", choices=("measure", "explain"), help="run one of the two parts")
    args = parser.parse_args()
    if args.worker:
        measure, n, model_dir = args.worker
        print(json.dumps(worker(measure, int(n), model_dir, args.reps)))
        return
    if args.only != "explain":
        measure_part(args)
    if args.only != "measure":
        explain_part(args)


def measure_part(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="attnviz-norms-bench-") as scratch:
        model_dir = build_model(Path(scratch) / "llama")
        print(f"1. measure norm vs weight, the last token's rows of every layer (one thread, {args.reps} reps)")
        for n in (int(x) for x in args.lengths.split(",")):
            t = run_worker("time", n, model_dir, args.reps)
            w, v = run_worker("weight", n, model_dir, 1), run_worker("norm", n, model_dir, 1)
            print(
                f"  n={n:6d}  time weight {t['weight_median']:.3f} s, norm {t['norm_median']:.3f} s (medians; "
                f"min {t['weight_min']:.3f} / {t['norm_min']:.3f})  ratio {t['norm_median'] / t['weight_median']:.3f} "
                f"(min {t['norm_min'] / t['weight_min']:.3f})"
            )
            print(
                f"           peak RSS weight {w['peak_rss_gb']:.3f} GB, norm {v['peak_rss_gb']:.3f} GB, ratio "
                f"{v['peak_rss_gb'] / w['peak_rss_gb']:.3f}; the pass above its start: {w['pass_gb'] * 1024:.1f} "
                f"/ {v['pass_gb'] * 1024:.1f} MB, ratio {v['pass_gb'] / max(w['pass_gb'], 1e-9):.3f}"
            )


def explain_part(args: argparse.Namespace) -> None:
    """Both commands as whole processes, interleaved: each one's wall time and its CPU time
    (user + system, from wait4). On a machine whose cores other processes keep busy the wall
    time mostly measures the queue; the CPU time is the work each command does."""
    print(f"2. explain vs show, whole processes ({args.runs} rounds, interleaved, one warm-up each)")
    exe = str(Path(sys.executable).with_name("attnviz"))
    commands = {
        "show": [exe, "show", EXAMPLE, "--token", "it", "--layer", "3", "--no-pager"],
        "explain": [exe, "explain", EXAMPLE, "--token", "it", "--layer", "3", "--head", "1", "--no-pager"],
    }
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for rnd in range(args.runs + 1):
        for name, cmd in commands.items():
            w, c = _one_process(cmd)
            if rnd:  # round 0 warms the page cache
                wall[name].append(w)
                cpu[name].append(c)
    med = {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in commands}
    for name, (w, c) in med.items():
        print(
            f"  {name:8s} wall median {w:6.3f} s (min {min(wall[name]):.3f})  "
            f"cpu median {c:6.3f} s (min {min(cpu[name]):.3f})"
        )
    print(
        f"  ratio explain / show: wall {med['explain'][0] / med['show'][0]:.3f} "
        f"(minima {min(wall['explain']) / min(wall['show']):.3f}), cpu {med['explain'][1] / med['show'][1]:.3f} "
        f"(minima {min(cpu['explain']) / min(cpu['show']):.3f})  target <= 1.1"
    )


def _one_process(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, user + system CPU seconds) of one run of ``cmd``."""
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[1:3])} failed ({proc.returncode}): {err[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
