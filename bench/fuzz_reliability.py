"""Fuzz what the command-line grammar cannot reach (issue 38): family configs at boundary
values held to transformers, models in memory with edits, notebook and widget arguments,
hostile config files and environments (tests/fuzz_reliability.py).

    python bench/fuzz_reliability.py [--cases 10000] [--seed N] [--failures fuzz-reliability.jsonl]

Prints the cases and failures per generator and how each case ended (refused: an
AttnvizError; both: ours and transformers answered and agree, or the case was checked;
ours_only: transformers cannot run the config, ours answered finitely). Target: 0 failures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--memory-gb", type=float, default=6.0)
    parser.add_argument("--failures", type=Path, default=Path("fuzz-reliability.jsonl"))
    args = parser.parse_args()
    cap = int(args.memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    from attnviz.engines import load_engine
    from attnviz.io.models import resolve
    from tests import fuzz_reliability as fr

    tally: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    failures: collections.Counter[str] = collections.Counter()
    seconds: collections.Counter[str] = collections.Counter()
    args.failures.unlink(missing_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnviz-fuzz-rel-") as scratch:
        root = Path(scratch)
        saved = fr.Saved(root)
        for name in fr.FAMILIES:
            saved.load(name)
        engine = load_engine("own", resolve(None), "cpu")
        cache: dict = {}
        count = [0]

        @settings(
            max_examples=args.cases,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(data=st.data())
        def one(data: st.DataObject) -> None:
            count[0] += 1
            n = count[0]
            # Family configs are the most numerous (every numeric key of nine families).
            kind = data.draw(st.sampled_from(("family", "family", "memory", "notebook", "settings")))
            t = time.perf_counter()
            if kind == "family":
                case: object = data.draw(fr.family_cases(saved))
                outcome, problem = fr.run_family(saved, case)  # type: ignore[arg-type]
            elif kind == "memory":
                case = data.draw(fr.memory_cases())
                outcome, problem = fr.run_memory(saved, case)  # type: ignore[arg-type]
            elif kind == "notebook":
                case = data.draw(fr.notebook_cases())
                outcome, problem = fr.run_notebook(engine, cache, case)  # type: ignore[arg-type]
            else:
                case = data.draw(fr.settings_cases())
                outcome, problem = fr.run_settings(root, n, case)  # type: ignore[arg-type]
            seconds[kind] += time.perf_counter() - t
            tally[kind][outcome] += 1
            if problem:
                failures[kind] += 1
                with args.failures.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"generator": kind, "case": ascii(case)[:2000], "problem": problem}) + "\n")
            if n % 500 == 0:
                done = sum(failures.values())
                sys.stderr.write(f"{n} cases, {done} failures, {time.perf_counter() - started:.0f} s\n")

        if args.seed is not None:
            one = seed(args.seed)(one)
        one()
    total = time.perf_counter() - started
    cases = sum(sum(c.values()) for c in tally.values())
    print(f"cases: {cases}  failures: {sum(failures.values())}  wall: {total:.0f} s (busy shared 2-core machine)")
    for kind in sorted(tally):
        outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(tally[kind].items()))
        print(
            f"{kind}: {sum(tally[kind].values())} cases, {failures[kind]} failures, {seconds[kind]:.0f} s; {outcomes}"
        )
    if failures:
        print(f"failing cases: {args.failures}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
