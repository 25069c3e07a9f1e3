"""Fuzz the whole command line: N command lines drawn from the CLI's own grammar.

The same property as tests/test_fuzz.py (exit code 0/1/2/130, no traceback, one error
line on failure, valid JSON from --json, no file left behind), over many more cases and
a fresh random draw each run. Prints the number of failures (target: 0), the exit codes
seen, and the slowest case; failing cases are written to --failures as JSON lines.

    python bench/fuzz.py [--cases 10000] [--seed N] [--failures fuzz-failures.jsonl]
                         [--json-cases N] [--process-cases N] [--pty-cases N]

After the command lines: N hostile JSON documents planted in every JSON input
(tests/fuzz_hostile.py; default: cases/10), N real processes with closed/full stdin and
stdout and a signal at a drawn moment, and N explorer sessions in a pty
(tests/fuzz_process.py; defaults: cases/200 and cases/1000, they start a process each).

One process: models load once (cached by engine, model and device), as in the test.
Its address space is capped (--memory-gb, default 6) so that a case which would
allocate without bound fails here instead of taking the machine.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    parser.add_argument("--memory-gb", type=float, default=6.0)
    parser.add_argument("--limit-s", type=int, default=120, help="a case slower than this is a failure")
    parser.add_argument("--failures", type=Path, default=Path("fuzz-failures.jsonl"))
    parser.add_argument("--json-cases", type=int, default=None, help="hostile JSON documents (default: cases/10)")
    parser.add_argument("--process-cases", type=int, default=None, help="real processes (default: cases/200)")
    parser.add_argument("--pty-cases", type=int, default=None, help="explorer sessions in a pty (default: cases/1000)")
    args = parser.parse_args()
    cap = int(args.memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    from attnviz.cli import app
    from tests.fuzz_grammar import command_lines, environments, grammar, make_files, models_loaded_once, run_case

    commands = grammar(app)
    outcomes: list = []
    codes: collections.Counter[int] = collections.Counter()
    envs: collections.Counter[str] = collections.Counter()
    failures = 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnviz-fuzz-") as scratch, models_loaded_once():
        files = make_files(Path(scratch))
        args.failures.unlink(missing_ok=True)

        @settings(
            max_examples=args.cases,
            deadline=None,
            database=None,
            phases=[Phase.generate],  # count every failure; no shrinking
            suppress_health_check=list(HealthCheck),
        )
        @given(data=st.data())
        def one(data: st.DataObject) -> None:
            nonlocal failures
            argv = data.draw(command_lines(commands, files))
            environment = data.draw(environments())  # COLUMNS and stdout's encoding (issue 25)
            outcome = run_case(app, argv, files, limit_s=args.limit_s, environment=environment)
            envs[environment.to_dict()["COLUMNS"] + "/" + environment.charset] += 1
            codes[outcome.exit_code] += 1
            outcomes.append((outcome.seconds, argv, outcome.exit_code))
            if outcome.problems:
                failures += 1
                with args.failures.open("a", encoding="utf-8") as fh:
                    record = {"argv": argv, "env": environment.to_dict(), "exit": outcome.exit_code,
                              "problems": outcome.problems, "stderr": outcome.stderr[-1500:]}  # fmt: skip
                    fh.write(json.dumps(record, ensure_ascii=True) + "\n")
            if len(outcomes) % 500 == 0:
                sys.stderr.write(f"{len(outcomes)} cases, {failures} failures, {time.perf_counter() - started:.0f} s\n")

        if args.seed is not None:
            one = seed(args.seed)(one)
        if args.cases:
            one()
        extra = run_extra(args, files, seed)
    total = time.perf_counter() - started
    for line in extra["lines"]:
        print(line)
    failures += extra["failures"]
    if not outcomes:
        print(f"failures: {failures}")
        sys.exit(1 if failures else 0)
    slowest = max(outcomes, key=lambda o: o[0])
    print(f"cases: {len(outcomes)}  failures: {failures}  wall: {total:.0f} s (busy shared 2-core machine)")
    print("exit codes: " + ", ".join(f"{code}: {n}" for code, n in sorted(codes.items())))
    print("environments (COLUMNS/encoding): " + ", ".join(f"{e}: {n}" for e, n in sorted(envs.items())))
    print(f"median case: {sorted(o[0] for o in outcomes)[len(outcomes) // 2] * 1000:.0f} ms")
    by_command: dict[str, list[float]] = collections.defaultdict(list)
    for secs, argv, _ in outcomes:
        by_command[argv[0]].append(secs)
    print("time by command: " + ", ".join(f"{c} {len(t)} cases {sum(t):.0f} s" for c, t in sorted(by_command.items())))
    print(f"slowest case: {slowest[0]:.1f} s, exit {slowest[2]}: attnviz {' '.join(map(ascii_arg, slowest[1]))}")
    drawn = {
        "explain": lambda a: a[0] == "explain",
        "--measure norm": lambda a: any(f == "--measure" and v == "norm" for f, v in zip(a, a[1:], strict=False)),
        "--ablate": lambda a: "--ablate" in a,
    }
    parts = []
    for label, hit in drawn.items():
        seen = [o for o in outcomes if hit(o[1])]
        ok = sum(o[2] == 0 for o in seen)
        parts.append(f"{label} {len(seen)} cases ({ok} exit 0, {sum(o[0] for o in seen):.0f} s)")
    print("drawn: " + ", ".join(parts))
    if failures:
        print(f"failing cases: {args.failures}")
    sys.exit(1 if failures else 0)


def run_extra(args: argparse.Namespace, files: object, seed: object) -> dict:
    """The hostile-JSON, real-process and pty generators; their failures go to --failures."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from tests.fuzz_hostile import Hostile, hostile_cases, json_problems
    from tests.fuzz_process import explore_cases, process_cases, run_explore, run_process

    counts = {
        "json": args.json_cases if args.json_cases is not None else args.cases // 10,
        "process": args.process_cases if args.process_cases is not None else args.cases // 200,
        "pty": args.pty_cases if args.pty_cases is not None else args.cases // 1000,
    }
    hostile = Hostile(files)  # type: ignore[arg-type]
    model = hostile.model
    out = hostile.root / "process-out"
    out.mkdir(exist_ok=True)
    tally: dict[str, collections.Counter] = {k: collections.Counter() for k in counts}
    seconds: dict[str, float] = dict.fromkeys(counts, 0.0)
    failed = collections.Counter()

    def record(kind: str, case: object, code: object, problems: list | tuple, took: float, err: str = "") -> None:
        tally[kind][str(code)] += 1
        seconds[kind] += took
        if problems:
            failed[kind] += 1
            with args.failures.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"generator": kind, "case": ascii(case)[:2000], "exit": code,
                                     "problems": list(problems), "stderr": err[-4000:]}) + "\n")  # fmt: skip

    def draw_json(data: st.DataObject) -> None:
        planted = data.draw(hostile_cases(hostile))
        o = json_problems(hostile, planted, limit_s=args.limit_s)
        record("json", (planted.target, planted.document[:300]), o.exit_code, o.problems, o.seconds)

    def draw_process(data: st.DataObject) -> None:
        case = data.draw(process_cases(model, out))
        t = time.perf_counter()
        code, err, problems = run_process(case)  # stderr kept: an abort says why only there
        record("process", case, code, problems, time.perf_counter() - t, err)

    def draw_pty(data: st.DataObject) -> None:
        case = data.draw(explore_cases())
        t = time.perf_counter()
        code, problems = run_explore(case, model)
        record("pty", case, code, problems, time.perf_counter() - t)

    for kind, body in (("json", draw_json), ("process", draw_process), ("pty", draw_pty)):
        if not counts[kind]:
            continue
        test = settings(max_examples=counts[kind], deadline=None, database=None, phases=[Phase.generate],
                        suppress_health_check=list(HealthCheck))(given(data=st.data())(body))  # fmt: skip
        if args.seed is not None:
            test = seed(args.seed)(test)  # type: ignore[operator]
        test()
    lines = [
        f"{kind}: {sum(tally[kind].values())} cases, {failed[kind]} failures, {seconds[kind]:.0f} s; exit codes "
        + ", ".join(f"{c}: {n}" for c, n in sorted(tally[kind].items()))
        for kind in counts
        if counts[kind]
    ]
    return {"lines": lines, "failures": sum(failed.values())}


def ascii_arg(arg: str) -> str:
    text = ascii(arg)[1:-1]
    return text if len(text) <= 80 else text[:77] + "..."


if __name__ == "__main__":
    main()
