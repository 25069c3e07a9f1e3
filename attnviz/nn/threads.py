"""How many CPU threads a hot path gets: chosen from its work and the cores free now.

torch's intra-op pool defaults to one thread per core. On a machine whose cores are
busy with other processes that is the slowest choice there is: every parallel region
ends at a barrier that waits for a descheduled thread. Measured on 2 shared cores with
one competing busy loop: ``attnviz heads`` on 400 texts went from 2.1 s to 14.0 s with
the default pool, 2.6 s on one thread; the weight check of MiniLM from 0.065 s to
0.28-0.86 s. So every hot path (the weight check, forward passes, heads batches) asks
``limited(work)`` for

    threads = min(⌈work / per_thread⌉, free cores, the thread setting before)

where the free cores are the cores of this process's CPU mask less the tasks that
are runnable right now and are not this process's threads (``/proc/loadavg``'s
running count, sampled a few times, the highest kept: one thread too few costs at most
the parallel speed-up, one too many can cost 5x). ``OMP_NUM_THREADS`` or
``torch.set_num_threads`` set by the user stays a ceiling.

Stdlib only at import time; torch is imported by ``limited`` when it runs.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

# Multiply-adds one thread is given before a second one helps: a MiniLM sentence (~0.3 G)
# takes ~15 ms on one core, under the cost of waking and joining a pool on a busy machine.
MACS_PER_THREAD = 2_000_000_000
# Elements a memory-bound pass (the NaN/Inf weight check) gives one thread: the check is
# a min/max reduction at memory bandwidth (50 M floats in 15 ms on one core here, no
# faster on two), so only very large checkpoints split it.
ELEMENTS_PER_THREAD = 1_000_000_000

_SAMPLES = 3
_SAMPLE_GAP_S = 0.0005


def cpu_count() -> int:
    """Cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _running_total() -> int | None:
    """Tasks runnable on the whole machine now (``/proc/loadavg`` field 4, "R/T")."""
    try:
        field = Path("/proc/loadavg").read_text().split()[3]
        return int(field.split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def _running_own() -> int:
    """This process's threads that are runnable now (the reading thread included)."""
    count = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 1
    for task in tasks:
        try:
            stat = Path(f"/proc/self/task/{task}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) S ...": the state follows the last ')' (comm may hold spaces).
        state = stat[stat.rfind(")") + 2 : stat.rfind(")") + 3]
        count += state == "R"
    return max(1, count)


def busy_elsewhere(samples: int = _SAMPLES) -> int:
    """Runnable tasks that are not this process's threads: the highest of ``samples``
    readings (Linux). Elsewhere, the 1-minute load average less this process's thread."""
    readings: list[int] = []
    for i in range(samples):
        total = _running_total()
        if total is None:
            break
        readings.append(max(0, total - _running_own()))
        if i + 1 < samples:
            time.sleep(_SAMPLE_GAP_S)
    if readings:
        return max(readings)
    try:
        return max(0, math.floor(os.getloadavg()[0] - 1 + 0.5))
    except (AttributeError, OSError):
        return 0


def free_cores() -> int:
    """Cores not taken by other runnable tasks right now, at least 1."""
    return max(1, cpu_count() - busy_elsewhere())


def choose(work: float, per_thread: float = MACS_PER_THREAD, ceiling: int | None = None) -> int:
    """Threads for ``work`` units: one per ``per_thread`` units, no more than the free
    cores, nor ``ceiling`` (the setting before); at least 1."""
    if per_thread <= 0:
        raise ValueError(f"per_thread={per_thread} must be positive")
    by_work = max(1, math.ceil(work / per_thread))
    if by_work == 1:
        return 1  # nothing to sample: one thread whatever the machine does
    top = cpu_count() if ceiling is None else max(1, ceiling)
    return max(1, min(by_work, top, free_cores()))


@contextlib.contextmanager
def limited(work: float, per_thread: float = MACS_PER_THREAD) -> Iterator[int]:
    """Run the block on ``choose(work, per_thread, torch's setting)`` CPU threads and
    restore the setting after; yields the count."""
    import torch

    before = torch.get_num_threads()
    count = choose(work, per_thread, before)
    if count == before:
        yield count
        return
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(before)
