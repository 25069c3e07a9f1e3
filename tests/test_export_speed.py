"""The export path's faster matplotlib import (issue 26): the same image bytes, and
matplotlib left as it was found."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from attnviz.example import EXAMPLE


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, check=False)


def test_kwdoc_is_put_back_and_the_axes_import() -> None:
    code = (
        "import matplotlib.artist as a\n"
        "original = a.kwdoc\n"
        "from attnviz.render import import_matplotlib_for_cli\n"
        "import_matplotlib_for_cli()\n"
        "import sys\n"
        "from matplotlib.lines import Line2D\n"
        "assert 'matplotlib.axes' in sys.modules and 'matplotlib.figure' in sys.modules\n"
        "assert a.kwdoc is original\n"
        "assert 'linewidth' in a.kwdoc(Line2D)\n"  # the real table, once the import is over
        "print('ok')\n"
    )
    result = run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_export_draws_the_same_bytes_as_a_plain_matplotlib_import(tmp_path: Path) -> None:
    """Two processes, each exporting a PNG and an SVG through the CLI: one on the fast path,
    one where matplotlib.axes was imported first the ordinary way (the fast path then does
    nothing)."""
    main = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from attnviz.cli import app\n"
        "for out in sys.argv[1:]:\n"
        "    done = CliRunner().invoke(app, ['export', EXAMPLE, '--token', 'it', '-o', out, '--device', 'cpu'])\n"
        "    assert done.exit_code == 0, done.output\n"
    ).replace("EXAMPLE", repr(EXAMPLE))
    plain = "import matplotlib.axes, matplotlib.figure, matplotlib.backends.backend_agg\n" + main
    outputs = []
    for name, code in (("fast", main), ("plain", plain)):
        outs = [tmp_path / f"{name}.{suffix}" for suffix in ("png", "svg")]
        result = run(code, *map(str, outs))
        assert result.returncode == 0, result.stderr
        outputs += [out.read_bytes() for out in outs]
    fast_png, fast_svg, plain_png, plain_svg = outputs
    assert fast_png[:8] == b"\x89PNG\r\n\x1a\n" and len(fast_png) > 10_000
    assert fast_png == plain_png
    assert fast_svg == plain_svg
