"""One token's rows as JSON: attnviz.jsonrows against the plain json.dumps(tolist()) path.

The rows of a 32-layer, 32-head model (the Llama-3-8B shape) at --keys tokens, random
weights normalised per row (float32); both writers produce the same numbers (checked).
Prints CPU and wall time of each, and their ratio. Target (issue 26): <= 1 s for
32 × 32 × 131,072 floats.

    python bench/rows_json_bench.py [--keys 131072] [--plain-keys 8192]
"""

from __future__ import annotations

import argparse
import json
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
    from attnviz.jsonrows import _table, encode
    from attnviz.result import jsonable

    rng = np.random.default_rng(0)
    _table()  # built once per process (8 MB)
    small = rng.random((32, 32, args.plain_keys), dtype=np.float32)
    small /= small.sum(-1, keepdims=True)
    fast, f_cpu, f_wall = timed(lambda: encode(small))
    plain, p_cpu, p_wall = timed(lambda: json.dumps(jsonable(small)))
    assert fast is not None and json.loads(fast.data) == json.loads(plain)
    print(f"32x32x{args.plain_keys:,} floats: jsonrows {f_cpu:.2f} s CPU ({f_wall:.2f} s wall), "
          f"plain {p_cpu:.2f} s CPU ({p_wall:.2f} s wall): {p_cpu / f_cpu:.1f}x less CPU")  # fmt: skip
    big = rng.random((32, 32, args.keys), dtype=np.float32)
    big /= big.sum(-1, keepdims=True)
    raw, cpu, wall = timed(lambda: encode(big))
    assert raw is not None
    scale = args.keys / args.plain_keys
    print(f"32x32x{args.keys:,} floats ({big.size:,}): jsonrows {cpu:.2f} s CPU, {wall:.2f} s wall, "
          f"{len(raw.data) / 2**20:.0f} MB; the plain path scaled from above: ~{p_cpu * scale:.0f} s CPU")  # fmt: skip


if __name__ == "__main__":
    main()
