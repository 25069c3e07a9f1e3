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

``--long N`` (default 8192 when given bare): a long text on the bench decoder (32 layers ×
32 query heads over 8 kv heads, width 256; bench/long_context.py's ``build_model``), where
the explorer draws the compact rows of the cursor's token, computed for a window of
``ROW_WINDOW`` tokens at a time (from the q and k the first pass kept, or a pass each).
Between keys the bench waits, as a person reading, for the views drawn ahead and the
windows fetched ahead. The reading keys' views are among those drawn ahead (w s m o and
the head table, with o's rows, the cursor's alone in the other measure, fetched in the
worker), so a reading key's first press after that pause is a lookup, as a step is: this
bench does not time drawing one without the pause (~20 ms of CPU a view at 8,192 tokens).
Pilot's wait reads the whole process's CPU time, worker threads included: a key is timed
until the app is idle, so work the app starts after a key (a long text's starts after a
0.25 s pause) is timed with it when it starts within the key's ~90 ms.

Groups: ``token`` (← → within the window), ``layer`` (↑ ↓), ``head``
([ ]), ``key X`` (the reading keys w s m o n v, each pressed twice: on, then off), ``floor``,
``new window`` (a ← → that leaves the cursor's window, timed to the new rows on screen) and
``cold window`` (a jump to a window nothing fetched, ``action_move_query``, to its rows on
screen; the rows are computed in a worker thread, so the cpu column leaves them out).

    python bench/explore_latency.py --long [8192] [--rounds 4]
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

from attnviz.example import EXAMPLE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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

    def run_sentence(text: str):  # type: ignore[no-untyped-def]
        return run(engine.tokenize(text), engine, Selection()).attention

    app = ExploreApp(att, run_sentence, query=att.tokens.labels.index("it"))
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


LONG_MOVES = ["right", "left", "up", "down", "right_square_bracket", "left_square_bracket"]
LONG_OPTIONS = ["w", "s", "m", "o", "n", "v"]  # each pressed twice: on, then off again
GROUP = {"right": "token", "left": "token", "up": "layer", "down": "layer", **{k: f"key {k}" for k in LONG_OPTIONS}}


async def measure_long(n: int, rounds: int) -> tuple[dict[str, list[tuple[float, float]]], float]:
    import tempfile

    from attnviz.cli.exploring import long_reading
    from attnviz.engines import load_engine
    from attnviz.pipeline import Selection
    from attnviz.select import Query
    from attnviz.tui.app import ExploreApp
    from attnviz.tui.long import ROW_WINDOW, window_of
    from bench.long_context import build_model, text_of

    groups = ["token", "layer", "head", *(f"key {k}" for k in LONG_OPTIONS), "floor", "new window", "cold window"]
    times: dict[str, list[tuple[float, float]]] = {group: [] for group in groups}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "decoder", layers=32, heads=32, kv_heads=8, max_positions=max(n, 8192))
        engine = load_engine("own", str(model), "cpu")
        start_q = n // 2 - n // 2 % ROW_WINDOW + ROW_WINDOW // 2  # the middle of a window
        t0 = time.perf_counter()
        first, rows = long_reading(engine, text_of(n), Selection(queries=(Query(index=start_q),)))
        first_s = time.perf_counter() - t0
        app = ExploreApp(first.attention, None, query=start_q, rows=rows)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()

            async def idle() -> None:
                # As a person reads: the views one key away drawn, the windows beside fetched.
                await asyncio.sleep(0.3)
                deadline = time.monotonic() + 600
                while (app.drawing_ahead or "rows" in app._busy) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)

            async def shown(begin: float, cpu: float) -> tuple[float, float]:
                """Wait for the cursor's rows on screen (a window being computed)."""
                if app._waiting:
                    while app._waiting:
                        await asyncio.sleep(0.005)
                    await pilot.pause()
                if f"token {app.cursor.query} " not in "\n".join(
                    s.text for s in app.screen._compositor.render_strips()
                ):
                    raise SystemExit("the new window's rows are not on screen")
                return time.perf_counter() - begin, time.thread_time() - cpu

            async def timed(key: str) -> tuple[str, tuple[float, float]]:
                window = window_of(app.long.pieces(app.cursor.query)[0], n)  # type: ignore[union-attr]
                begin, cpu = time.perf_counter(), time.thread_time()
                await pilot.press(key)
                await pilot.pause()
                t = await shown(begin, cpu)
                # A token key that leaves the cursor's window: a forward pass before kept keys
                # and windows fetched ahead (the new window's rows then wait for it).
                if GROUP.get(key) == "token" and window_of(app.long.pieces(app.cursor.query)[0], n) != window:  # type: ignore[union-attr]
                    return "new window", t
                return GROUP.get(key, "head"), t

            for _ in range(rounds):
                order = LONG_MOVES[:]
                rng.shuffle(order)
                for key in order:
                    await idle()
                    group, t = await timed(key)
                    times[group].append(t)
                    await idle()
                    times["floor"].append((await timed("z"))[1])
                for key in LONG_OPTIONS:
                    for _ in range(2):
                        await idle()
                        group, t = await timed(key)
                        times[group].append(t)
            # Token moves until the window is left (at most ROW_WINDOW): the forward a key can cost.
            for step in ("right", "left"):
                before = len(times["new window"])
                for _ in range(2 * ROW_WINDOW):
                    await idle()
                    group, t = await timed(step)
                    times[group].append(t)
                    if len(times["new window"]) > before:
                        break
            # A jump to a window nothing fetched ahead (no key does it: the time to compute one).
            for far in (n // 8, n - n // 8):
                await idle()
                begin, cpu = time.perf_counter(), time.thread_time()
                app.action_move_query(far - app.cursor.query)
                times["cold window"].append(await shown(begin, cpu))
    return times, first_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="passes over the keys (8 keys each)")
    parser.add_argument("--long", type=int, nargs="?", const=8192, default=None, metavar="N",
                        help="a long text of N tokens (8192) on the bench decoder: the compact rows")  # fmt: skip
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if args.long is not None:
        times, first_s = asyncio.run(measure_long(args.long, args.rounds))
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"attnviz explore, {SIZE[0]}×{SIZE[1]}, bench decoder 32 layers × 32/8 heads, {args.long:,} tokens")
        print(f"first rows (CLI, before the app): {first_s:.1f} s")
    else:
        times = asyncio.run(measure(args.rounds))
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"attnviz explore, {SIZE[0]}×{SIZE[1]}, packaged MiniLM, {EXAMPLE!r}")
    floor = statistics.median(wall for wall, _ in times["floor"])
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load:.1f} at the end")
    print(
        f"{'keys':<14}{'n':>4}{'wall median':>13}{'p95':>7}{'max':>7}{'/ floor':>9}{'cpu median':>12}{'p95':>7}   (ms)"
    )
    for group, values in times.items():
        if not values:
            continue
        wall = [w * 1000 for w, _ in values]
        cpu = [c * 1000 for _, c in values]
        print(
            f"{group:<14}{len(wall):>4}{statistics.median(wall):>13.1f}{pct(wall, 0.95):>7.1f}{max(wall):>7.1f}"
            f"{statistics.median(wall) / (floor * 1000):>9.2f}{statistics.median(cpu):>12.1f}{pct(cpu, 0.95):>7.1f}"
        )


if __name__ == "__main__":
    main()
