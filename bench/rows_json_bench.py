"""One token's rows as JSON: attnviz.io.jsonrows against the plain json.dumps(tolist()) path.

The rows of a 32-layer, 32-head model (the Llama-3-8B shape) at --keys tokens, random
weights normalised per row (float32); both writers produce the same numbers (checked).
Prints CPU and wall time of each, and their ratio. The large case is timed as the CLI
writes it: ``jsonrows.write`` of the document to /dev/null, the text spelled block by
block as it goes; the process's peak RSS growth over the array is printed beside it.
Target (issue 26): <= 1 s for 32 × 32 × 131,072 floats.

    python bench/rows_json_bench.py [--keys 131072] [--plain-keys 8192]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np


def timed(fn):  # type: ignore[no-untyped-def]
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=131072)
    parser.add_argument("--plain-keys", type=int, default=8192, help="the plain path is timed here and scaled")
    args = parser.parse_args()
    from attnviz.io.jsonrows import _table, encode, write
    from attnviz.result import jsonable

    rng = np.random.default_rng(0)
    _table()  # built once per process (8 MB)
    small = rng.random((32, 32, args.plain_keys), dtype=np.float32)
    small /= small.sum(-1, keepdims=True)
    fast, f_cpu, f_wall = timed(lambda: encode(small))
    if fast is not None:  # spelled when read: time the spelling
        data, f_cpu, f_wall = timed(lambda: fast.data)
    plain, p_cpu, p_wall = timed(lambda: json.dumps(jsonable(small)))
    assert fast is not None and json.loads(data) == json.loads(plain)
    print(f"32x32x{args.plain_keys:,} floats: jsonrows {f_cpu:.2f} s CPU ({f_wall:.2f} s wall), "
          f"plain {p_cpu:.2f} s CPU ({p_wall:.2f} s wall): {p_cpu / f_cpu:.1f}x less CPU")  # fmt: skip
    big = rng.random((32, 32, args.keys), dtype=np.float32)
    big /= big.sum(-1, keepdims=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(os.devnull, "wb") as sink:
        counted = Counted(sink)
        _, cpu, wall = timed(lambda: write({"weights": encode(big)}, counted))
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    scale = args.keys / args.plain_keys
    print(f"32x32x{args.keys:,} floats ({big.size:,}): jsonrows.write {cpu:.2f} s CPU, {wall:.2f} s wall, "
          f"{counted.bytes / 2**20:.0f} MB of JSON, peak RSS +{grown:.0f} MB over the "
          f"{big.nbytes / 2**20:.0f} MB array; the plain path scaled: ~{p_cpu * scale:.0f} s CPU")  # fmt: skip


class Counted:
    """A binary stream that counts what passes through to ``sink``."""

    def __init__(self, sink) -> None:  # type: ignore[no-untyped-def]
        self.sink, self.bytes = sink, 0

    def write(self, data) -> int:  # type: ignore[no-untyped-def]
        self.bytes += len(data)
        return self.sink.write(data)

    def flush(self) -> None:
        self.sink.flush()


if __name__ == "__main__":
    main()
