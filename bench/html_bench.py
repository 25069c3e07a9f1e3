"""The interactive HTML page: its size against the estimate, and how fast headless Chromium
opens it and answers a click, as the sentence grows.

    python bench/html_bench.py [--tokens 15,64,128,256]
    python bench/html_bench.py --rows [--tokens 4096]

Full pages: packaged all-MiniLM-L6-v2 (6 layers × 12 heads), every layer in the page.

--rows: the row-mode page (issue 22) of the bench decoder, Llama 3 8B's layer and head
counts at a small width (32 layers, 32 query heads over 8 key/value heads, hidden 256,
intermediate 512, random weights, a word-level tokenizer; built here with transformers'
LlamaConfig and save_pretrained, nothing downloaded), written by the real command
(``attnviz export --file ... --index N-1 --rows -o page.html``: one query, the last token,
all layers). Prints the page size (target <= 16 MB), the time to open it in headless
Chromium up to its first drawing (target <= 3 s) and the reaction to a click on the query
token (target <= 100 ms), with a layer change and the model view beside them.

Times are wall-clock in the page (performance.now), median of --reps, and noisy on a shared
machine: read them as orders of magnitude. Needs /usr/bin/chromium and chromedriver.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnviz.engines import load_engine  # noqa: E402
from attnviz.pipeline import Selection, run  # noqa: E402
from attnviz.render.html import page_size, save_html  # noqa: E402
from tests import browser  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_context import VOCAB, build_model  # noqa: E402

from attnviz.example import EXAMPLE  # noqa: E402

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


def build_decoder(directory: Path) -> Path:
    """The 32 × 32/8 bench decoder at a small width and its tokenizer, saved in ``directory``."""
    return build_model(directory, layers=32, heads=32, kv_heads=8, max_positions=8192)


def rows_bench(lengths: list[int], reps: int) -> None:
    """The row-mode page of the bench decoder, written by the CLI, opened in Chromium."""
    import subprocess
    import time

    print(
        "| tokens | page | storage, largest error | forward + page (CLI) | open + first draw | click the query "
        "| next layer | model view |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, browser.chromium(1280, 1000) as driver:
        driver.set_script_timeout(300)
        model = build_decoder(Path(tmp) / "decoder")
        for n in lengths:
            text = Path(tmp) / f"t{n}.txt"
            text.write_text(" ".join(f"w{(i * 7919) % (VOCAB - 3)}" for i in range(n - 1)))  # + <s>: n tokens
            path = Path(tmp) / f"r{n}.html"
            cmd = [sys.executable, "-m", "attnviz", "export", "--file", str(text), "--model", str(model),
                   "--index", str(n - 1), "--rows", "-o", str(path)]  # fmt: skip
            start = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            seconds = time.perf_counter() - start
            if done.returncode:
                sys.exit(f"the CLI failed: {done.stderr.strip()}")
            note = next((line for line in done.stderr.splitlines() if line.startswith("note: row mode")), "")
            m = re.search(r" as (uint\d+): .* largest error (\S+)", note)
            storage = f"{m[1]}, {m[2]}" if m else "?"
            times: dict[str, list[float]] = {"open": [], "click": [], "layer": [], "model": []}
            a = "window.attnviz"
            for _ in range(reps):
                driver.get(path.as_uri())
                times["open"].append(
                    driver.execute_async_script(
                        "const done = arguments[arguments.length - 1];"
                        "requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now())));"
                    )
                )
                # A real click on the query token's button (unpins it), then again (pins it).
                for _ in range(2):
                    times["click"].append(
                        driver.execute_async_script(FRAME % "document.querySelector('#hv-left .tok').click()")
                    )
                times["layer"].append(
                    driver.execute_async_script(
                        FRAME % "document.dispatchEvent(new KeyboardEvent('keydown', {key: ']'}))"
                    )
                )
                times["model"].append(driver.execute_async_script(FRAME % f"{a}.state.view = 'model'; {a}.render()"))
            errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
            if errors:
                sys.exit(f"the page logged: {errors}")
            med = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"| {n} | {path.stat().st_size / 1e6:.2f} MB | {storage} | {seconds:.1f} s | {med['open']:.0f} ms "
                f"| {med['click']:.0f} ms | {med['layer']:.0f} ms | {med['model']:.0f} ms |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default=None, help="token counts [default: 15,64,128,256; with --rows 4096]")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rows", action="store_true", help="the row-mode page of the 32 × 32/8 bench decoder")
    args = parser.parse_args()
    if browser.missing():
        sys.exit(f"cannot run: {browser.missing()}")
    if args.rows:
        rows_bench([int(x) for x in (args.tokens or "4096").split(",")], args.reps)
        return
    args.tokens = args.tokens or "15,64,128,256"
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
