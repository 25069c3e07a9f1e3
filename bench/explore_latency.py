"""Per-keypress latency of ``attnviz explore``, through textual's Pilot, in one run.

The packaged MiniLM and the README's example sentence are loaded once (as the command
does); then the app runs headless at 120 × 40 and keys are pressed one at a time. A
key's latency is the wall time from sending it to the end of the repaint it causes
(``pilot.press`` then ``pilot.pause``: every message handled and the screen composited).
Beside it, the CPU time the app's thread spent in that span (``time.thread_time``: the
app, textual and Pilot run on this one thread), which a busy machine inflates far less
than wall time: on a shared machine it is the better estimate of an idle one's latency.

Three groups, interleaved in one run so that the machine's load hits them alike:

- ``reading``: a key after a pause, as a person reads the screen before the next key
  (the views one key away are drawn ahead in that time: the bench waits until they are);
- ``held``: keys back to back, as when an arrow key is held down (no time to draw ahead);
- ``floor``: a key bound to nothing, pressed once the app is idle: what Pilot and
  textual cost for any key.

Then ``/``: a new sentence typed and run, timed from Enter to its tokens on screen.

    python bench/explore_latency.py [--rounds 6]

Prints medians and 95th percentiles in milliseconds, and each group's ratio to the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXAMPLE = "The animal didn't cross the street because it was too tired"
OTHER = "The trophy doesn't fit in the brown suitcase because it is too big"
MOVES = ["right", "left", "up", "down", "right_square_bracket", "left_square_bracket", "v", "n"]
SIZE = (120, 40)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(rounds: int) -> dict[str, list[tuple[float, float]]]:
    from attnviz.engines import load_engine
    from attnviz.pipeline import Selection, run
    from attnviz.tui.app import ExploreApp

    engine = load_engine("own", None, "cpu")
    att = run(EXAMPLE, engine, Selection()).attention

    def run(text: str):  # type: ignore[no-untyped-def]
        return run(engine.tokenize(text), engine, Selection()).attention

    app = ExploreApp(att, run, query=att.tokens.labels.index("it"))
    times: dict[str, list[tuple[float, float]]] = {"reading": [], "held": [], "floor": [], "new sentence": []}
    rng = random.Random(0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()

        async def idle() -> None:
            await asyncio.sleep(0.3)
            deadline = time.monotonic() + 10
            while app.drawing_ahead and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

        async def timed(key: str) -> tuple[float, float]:
            start, cpu = time.perf_counter(), time.thread_time()
            await pilot.press(key)
            await pilot.pause()
            return time.perf_counter() - start, time.thread_time() - cpu

        for _ in range(rounds):
            order = MOVES[:]
            rng.shuffle(order)
            for key in order:
                # One of each group per key, in a shuffled order.
                groups = ["reading", "held", "floor"]
                rng.shuffle(groups)
                for group in groups:
                    if group != "held":
                        await idle()
                    times[group].append(await timed("z" if group == "floor" else key))  # z: bound to nothing
                    if group == "held":
                        # A second one straight after: the first may have hit a view drawn ahead.
                        times[group].append(await timed(key))
            for sentence in (OTHER, EXAMPLE):
                await pilot.press("slash")
                app.query_one("#ask").value = sentence  # type: ignore[attr-defined]
                start, cpu = time.perf_counter(), time.thread_time()
                await pilot.press("enter")
                await app.workers.wait_for_complete()
                await pilot.pause()
                # The forward pass runs in a worker thread: its CPU time is not counted here.
                times["new sentence"].append((time.perf_counter() - start, time.thread_time() - cpu))
                shown = "\n".join(s.text for s in app.screen._compositor.render_strips())
                if sentence.split()[1] not in shown or "new sentence" not in shown:
                    raise SystemExit(f"the new sentence is not on screen:\n{shown}")
                await asyncio.sleep(0.3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="passes over the keys (8 keys each)")
    args = parser.parse_args()
    times = asyncio.run(measure(args.rounds))
    floor = statistics.median(wall for wall, _ in times["floor"])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"attnviz explore, {SIZE[0]}×{SIZE[1]}, packaged MiniLM, {EXAMPLE!r}")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load:.1f} at the end")
    print(
        f"{'keys':<14}{'n':>4}{'wall median':>13}{'p95':>7}{'max':>7}{'/ floor':>9}{'cpu median':>12}{'p95':>7}   (ms)"
    )
    for group, values in times.items():
        wall = [w * 1000 for w, _ in values]
        cpu = [c * 1000 for _, c in values]
        print(
            f"{group:<14}{len(wall):>4}{statistics.median(wall):>13.1f}{pct(wall, 0.95):>7.1f}{max(wall):>7.1f}"
            f"{statistics.median(wall) / (floor * 1000):>9.2f}{statistics.median(cpu):>12.1f}{pct(cpu, 0.95):>7.1f}"
        )


if __name__ == "__main__":
    main()
