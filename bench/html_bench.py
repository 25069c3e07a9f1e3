"""The interactive HTML page: its size against the estimate, and how fast headless Chromium
opens it and answers a click, as the sentence grows.

    python bench/html_bench.py [--tokens 15,64,128,256]

Packaged all-MiniLM-L6-v2 (6 layers × 12 heads), every layer in the page. Times are
wall-clock in the page (performance.now), median of --reps, and noisy on a shared machine:
read them as orders of magnitude. Needs /usr/bin/chromium and chromedriver.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnviz.engines import load_engine  # noqa: E402
from attnviz.pipeline import Selection, run  # noqa: E402
from attnviz.render.html import page_size, save_html  # noqa: E402
from tests import browser  # noqa: E402

EXAMPLE = "The animal didn't cross the street because it was too tired"
FILLER = "The committee published its long report on the river, and the fishermen read every page because it changed."

# Two animation frames after the work: the drawing has reached the screen.
FRAME = """const done = arguments[arguments.length - 1]; const t = performance.now(); %s;
requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now() - t)));"""


def sentence(tokens: int, engine: object) -> str:
    if tokens <= 15:
        return EXAMPLE
    words = (FILLER + " ") * (tokens // 10 + 2)
    text = words.split()
    lo, hi = 1, len(text)
    while lo < hi:  # the longest prefix with at most `tokens` tokens
        mid = (lo + hi + 1) // 2
        if len(engine.tokenize(" ".join(text[:mid]))) <= tokens:  # type: ignore[attr-defined]
            lo = mid
        else:
            hi = mid - 1
    return " ".join(text[:lo])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="15,64,128,256")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if browser.missing():
        sys.exit(f"cannot run: {browser.missing()}")
    engine = load_engine("own", None, "cpu")
    print("| tokens | page | estimate | open + first draw | click a token | model view | matrix |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, browser.chromium(1280, 1000) as driver:
        driver.set_script_timeout(300)
        for n in (int(x) for x in args.tokens.split(",")):
            att = run(sentence(n, engine), engine, Selection()).attention
            s = len(att.tokens)
            path = Path(tmp) / f"p{s}.html"
            size = save_html(att, path)
            times: dict[str, list[float]] = {"open": [], "click": [], "model": [], "matrix": []}
            for _ in range(args.reps):
                driver.get(path.as_uri())
                # From the start of navigation to the end of the first render (the page's
                # script runs synchronously at the end of <body>).
                times["open"].append(
                    driver.execute_async_script(
                        "const done = arguments[arguments.length - 1];"
                        "requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now())));"
                    )
                )
                a = "window.attnviz"
                times["click"].append(driver.execute_async_script(FRAME % f"{a}.state.pinned = {s // 2}; {a}.render()"))
                times["model"].append(driver.execute_async_script(FRAME % f"{a}.state.view = 'model'; {a}.render()"))
                times["matrix"].append(driver.execute_async_script(FRAME % f"{a}.state.view = 'matrix'; {a}.render()"))
            errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
            if errors:
                sys.exit(f"the page logged: {errors}")
            med = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"| {s} | {size / 1e6:.2f} MB | {page_size(6, 12, s) / 1e6:.2f} MB | {med['open']:.0f} ms "
                f"| {med['click']:.0f} ms | {med['model']:.0f} ms | {med['matrix']:.0f} ms |"
            )


if __name__ == "__main__":
    main()
