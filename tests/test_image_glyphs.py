"""Labels no installed font can draw (issue 25): CJK and emoji labels came out as empty
boxes with 8 lines of matplotlib UserWarning. Installed fallback fonts are used; what no
font has is returned by ``save_figure`` and said in one note line, the warnings gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from attnviz.render.image import save_figure

ROOT = Path(__file__).resolve().parent.parent
PRIVATE = "\ue000\ue001"  # private-use code points: no font has glyphs for them


def figure(text: str) -> Figure:
    fig = Figure(figsize=(2, 1))
    fig.text(0.1, 0.5, text)
    return fig


@pytest.mark.parametrize("suffix", [".png", ".pdf"])
def test_missing_glyphs_are_returned_not_warned(tmp_path: Path, suffix: str, recwarn: pytest.WarningsRecorder) -> None:
    path = tmp_path / f"x{suffix}"
    assert save_figure(figure(f"cat {PRIVATE} cat"), path) == tuple(PRIVATE)
    assert path.stat().st_size > 0
    assert not [w for w in recwarn if "Glyph" in str(w.message)]


def test_drawable_labels_and_svg_text_report_nothing(tmp_path: Path) -> None:
    assert save_figure(figure("the cat sat"), tmp_path / "a.png") == ()
    assert save_figure(figure(PRIVATE), tmp_path / "b.svg") == ()  # SVG text: the viewer's fonts draw it


def test_export_says_it_in_one_note_line(tmp_path: Path) -> None:
    out = tmp_path / "cjk.png"
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "attnviz", "export", f"我在東京 cat {PRIVATE}", "--token", "cat", "-o", str(out)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == f"wrote {out}"
    assert "Warning" not in done.stderr and "Glyph" not in done.stderr
    assert len(lines) <= 2  # the note, unless every label character has a font here
    if len(lines) == 2:
        assert lines[1].startswith("attnviz: note: no installed font has ") and "empty boxes" in lines[1]
