"""Capture the README's screen of ``attnviz explore``: an SVG from textual, turned into
a PNG by headless Chromium (without Chromium, the SVG is kept beside the PNG's path).

    python docs/capture_explore.py docs/images/explore.png

Runs the app headless through Pilot on the README's example, moves to "it" in layer 3,
head 1, and saves what the screen shows.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from attnviz.example import EXAMPLE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZE = (104, 30)


async def capture(svg: Path) -> None:
    from attnviz.engines import load_engine
    from attnviz.pipeline import Selection, run
    from attnviz.tui.app import ExploreApp

    engine = load_engine("own", None, "cpu")
    att = run(EXAMPLE, engine, Selection()).attention
    app = ExploreApp(att, query=att.tokens.labels.index("it"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("up", "up", "up", "right_square_bracket")
        await pilot.pause()
        app.save_screenshot(filename=svg.name, path=str(svg.parent))


def main() -> None:
    png = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images/explore.png")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        svg = png.with_suffix(".svg")
        asyncio.run(capture(svg))
        print(f"no chromium: wrote {svg} only")
        return
    with tempfile.TemporaryDirectory() as tmp:
        svg = Path(tmp) / "explore.svg"
        asyncio.run(capture(svg))
        # The window fits the SVG's viewBox (104 × 30 cells at textual's font metrics).
        subprocess.run(
            [
                chromium,
                "--headless",
                "--disable-gpu",
                "--no-sandbox",
                "--hide-scrollbars",
                f"--screenshot={png.resolve()}",
                "--window-size=1300,800",
                svg.as_uri(),
            ],
            check=True,
            capture_output=True,
        )
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
