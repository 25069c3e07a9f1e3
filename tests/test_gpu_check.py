"""bench/gpu_check.py, the one script a GPU machine runs, proved on the CPU first
(``--device cpu --small``): every column runs and the table comes out; without CUDA,
``--device cuda`` is one clear line and exit 2, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"


def test_small_run_on_the_cpu_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--tests", "none", "--lengths", "64,96",
         "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    table = out.read_text()
    assert table in done.stdout
    rows = [line for line in table.splitlines() if line.startswith("| 64 |") or line.startswith("| 96 |")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        # own peak and pass, floor peak and pass, eager peak and pass: all measured
        assert all(cells[i].endswith((" GB", " s")) for i in (1, 2, 5, 6, 7, 8)), row
        assert float(cells[9]) > 0 and float(cells[10]) > 0  # the two ratios to the floor


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_cuda_branch_is_one_line() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device here" in lines[0] and "--device cpu --small" in lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
