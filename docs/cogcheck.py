"""``cog --check`` that lets a number move by the last digits a CPU changes.

Every quoted output in the docs is re-run by cog (docs/cogutil.py). A few of them print
float32 rounding: `attnviz check`'s worst |Δ| against transformers is 0.0e+00 on one CPU
and 1.2e-06 on another (AVX-512: other matrix kernels), a stored row's largest error
2.3e-05 or 2.1e-05. Those are not stale docs, and a docs check must not depend on the
machine it runs on. This one regenerates each file as cog does and compares it with the
file as written: every character outside numbers must be the same, and every number the
same or within 1e-5 of it (a count, a size, a label or a path that changed still fails).

    PYTHONPATH=$PWD:$PWD/docs python docs/cogcheck.py README.md docs/*.md
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
TOLERANCE = 1e-5


def differences(written: str, now: str) -> list[str]:
    """The lines where ``now`` differs from ``written`` beyond moved last digits."""
    problems = []
    old_lines, new_lines = written.splitlines(), now.splitlines()
    if len(old_lines) != len(new_lines):
        return [f"{len(old_lines)} lines written, {len(new_lines)} now"]
    for number, (old, new) in enumerate(zip(old_lines, new_lines, strict=True), 1):
        if old != new and not _same(old, new):
            problems.append(f"line {number}:\n  written: {old}\n  now:     {new}")
    return problems


def _same(old: str, new: str) -> bool:
    old_numbers, new_numbers = NUMBER.findall(old), NUMBER.findall(new)
    if len(old_numbers) != len(new_numbers):
        return False
    # Outside the numbers only spaces may differ (a right-aligned column of another width).
    if NUMBER.sub("#", old).split() != NUMBER.sub("#", new).split():
        return False
    return all(a == b or abs(float(a) - float(b)) <= TOLERANCE for a, b in zip(old_numbers, new_numbers, strict=True))


def main(files: list[str]) -> int:
    failed = 0
    with tempfile.TemporaryDirectory(prefix="attnviz-cogcheck-") as scratch:
        for name in files:
            path = Path(name)
            out = Path(scratch) / path.name
            run = subprocess.run(["cog", "-o", str(out), str(path)], capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{name}: cog failed\n{run.stderr.strip()}", file=sys.stderr)
                failed += 1
                continue
            problems = differences(path.read_text(encoding="utf-8"), out.read_text(encoding="utf-8"))
            if problems:
                failed += 1
                print(f"{name}: stale (regenerate: cog -r {name})", file=sys.stderr)
                for problem in problems[:10]:
                    print(problem, file=sys.stderr)
            else:
                print(f"{name}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
