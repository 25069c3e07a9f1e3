"""Full garbage collections while ``attnviz explore`` runs, with its ``gc.freeze()`` calls
on or off: bench/explore_latency.py run as it is, every generation-2 collection made
while the app is mounted timed through ``gc.callbacks``.

    python bench/explore_gc.py {freeze|mount-only|none} [explore_latency.py's arguments]

``freeze``: the explorer as it is; ``mount-only``: ``_settle`` does nothing (no
collect(1) and freeze after each round of drawing ahead); ``none``: neither the freeze on
mount nor ``_settle``'s. Prints the number of full collections and their wall and CPU
times (median, max, total). The freezes' reason, measured: tui/app.py's comments.
"""

from __future__ import annotations

import gc
import runpy
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    variants = ("freeze", "mount-only", "none")
    if len(sys.argv) < 2 or sys.argv[1] not in variants:
        raise SystemExit(f"usage: python bench/explore_gc.py {{{'|'.join(variants)}}} [explore_latency.py's arguments]")
    variant, rest = sys.argv[1], sys.argv[2:]
    from attnviz.tui import app as app_mod

    full: list[tuple[float, float]] = []  # (wall, CPU) seconds of each full collection
    live, started = {"on": False}, {}

    def timed(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2 or not live["on"]:
            return
        if phase == "start":
            started["at"] = (time.perf_counter(), time.thread_time())
        elif "at" in started:
            wall, cpu = started.pop("at")
            full.append((time.perf_counter() - wall, time.thread_time() - cpu))

    gc.callbacks.append(timed)
    mount = app_mod.ExploreApp.on_mount

    def on_mount(self: Any) -> None:
        live["on"] = True
        mount(self)

    app_mod.ExploreApp.on_mount = on_mount  # type: ignore[method-assign]
    if variant in ("mount-only", "none"):
        app_mod.ExploreApp._settle = lambda self: None  # type: ignore[method-assign]
    if variant == "none":
        app_mod.gc = types.SimpleNamespace(freeze=lambda: None, unfreeze=lambda: None, collect=gc.collect)  # type: ignore[assignment]
    sys.argv = [str(ROOT / "bench" / "explore_latency.py"), *rest]
    start = time.perf_counter()
    runpy.run_path(sys.argv[0], run_name="__main__")
    live["on"] = False
    line = f"[{variant}] {time.perf_counter() - start:.0f} s; full collections while the app ran: {len(full)}"
    if full:
        wall, cpu = ([t * 1e3 for t in times] for times in zip(*full, strict=True))
        line += (
            f"; wall median {statistics.median(wall):.1f} ms, max {max(wall):.1f}; "
            f"CPU median {statistics.median(cpu):.1f} ms, max {max(cpu):.1f}, total {sum(cpu):.0f}"
        )
    print(line)


if __name__ == "__main__":
    main()
