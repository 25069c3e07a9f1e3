"""Every engine path on the run's --device, in float32 and bfloat16, against transformers'
eager weights computed on the CPU in float32.

By default the device is the CPU; bench/gpu_check.py runs exactly these tests with
``pytest -m device --device cuda`` on a GPU machine: show, compare, export, heads and
check through the CLI, both engines, explain, ``--measure norm`` and ``--ablate``, a
grouped-query decoder through the fused kernel, and the weight check on the device.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.engines import load_engine
from attnviz.example import EXAMPLE

from .builders import SPECS, save_tiny
from .helpers import inspect

pytestmark = pytest.mark.device

DTYPE_TOL = {"float32": 1e-5, "bfloat16": 2e-2}  # one token's rows, as tests/test_rows.py documents
# Every row of every layer drifts further in bfloat16: 2.6e-2 measured on the tiny Qwen2 (CPU).
FULL_TOL = {"float32": 1e-5, "bfloat16": 4e-2}
DTYPES = list(DTYPE_TOL)
runner = CliRunner()


def cli(*args: str) -> Any:
    result = runner.invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A BERT (encoder), a GPT-2 (causal) and a Qwen2 (4 query heads over 2 key/value heads)."""
    root = tmp_path_factory.mktemp("device-models")
    by_name = {s.name: s for s in SPECS}
    return {name: save_tiny(by_name[name], root / name) for name in ("bert", "gpt2", "qwen2")}


def _truth(model: str | Path | None, text: str, query: int | None = None) -> np.ndarray:
    """transformers eager, CPU, float32: (N, H, Q, S) of every layer."""
    ref = load_engine("hf", None if model is None else str(model), "cpu", "float32")
    tokens = ref.tokenize(text)
    att = inspect(tokens, ref, None, None if query is None else (query,))
    return att.weights


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("engine", ["own", "hf"])
def test_show_json_on_the_device(device: str, dtype: str, engine: str) -> None:
    out = json.loads(cli("show", EXAMPLE, "--token", "it", "--json", "--device", device, "--dtype", dtype,
                         "--engine", engine).stdout)  # fmt: skip
    assert out["device"].startswith(device.split(":")[0]) and out["dtype"] == dtype
    truth = _truth(None, EXAMPLE, out["query_index"])[:, :, 0]  # (N, H, S)
    got = np.array(out["weights"], dtype=np.float64)
    assert got.shape == truth.shape
    assert float(np.abs(got - truth).max()) <= DTYPE_TOL[dtype] + 1e-6  # + JSON's 6 decimals


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["bert", "gpt2", "qwen2"])
def test_own_engine_rows_and_full_matrices_on_the_device(
    device: str, dtype: str, name: str, tiny: dict[str, Path]
) -> None:
    """One token's rows (the fused kernel plus exact rows: GQA in Qwen2) and every row
    (chunked eager) on the device, against transformers' float32 eager on the CPU."""
    text = "the cat sat on the mat and the dog sat by the door because it was too tired"
    eng = load_engine("own", str(tiny[name]), device, dtype)
    assert next(eng.model.parameters()).device.type == torch.device(device).type
    tokens = eng.tokenize(text)
    last = len(tokens) - 1
    rows = inspect(tokens, eng, None, (last, 2)).weights
    truth = _truth(tiny[name], text)
    assert float(np.abs(rows - truth[:, :, [last, 2]]).max()) <= DTYPE_TOL[dtype]
    full = inspect(tokens, eng, None, None).weights
    assert float(np.abs(full - truth).max()) <= FULL_TOL[dtype]
    np.testing.assert_allclose(full.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_compare_export_check_on_the_device(device: str, dtype: str, tmp_path: Path) -> None:
    common = ("--device", device, "--dtype", dtype)
    out = json.loads(cli("compare", EXAMPLE, "--token", "it", "--target", "animal", "--json", *common).stdout)
    assert out
    png = tmp_path / "it.png"
    cli("export", EXAMPLE, "--token", "it", "-o", str(png), *common)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if dtype == "float32":  # check compares the own engine with transformers in float32
        cli("check", "--device", device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_heads_on_the_device_match_the_cpu(device: str, dtype: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join([EXAMPLE, "The trophy didn't fit in the suitcase because it was too big", "A dog ran."] * 3) + "\n"
    )
    here = json.loads(cli("heads", str(corpus), "--json", "--device", device, "--dtype", dtype).stdout)
    cpu = json.loads(cli("heads", str(corpus), "--json", "--device", "cpu", "--dtype", "float32").stdout)
    assert here["texts"] == cpu["texts"] == 9
    means = {(r["detector"], r["layer"], r["head"]): r["mean"] for r in cpu["scores"]}
    worst = max(abs(r["mean"] - means[(r["detector"], r["layer"], r["head"])]) for r in here["scores"])
    assert worst <= (1e-5 if dtype == "float32" else 5e-2)


def _close(got: Any, want: Any, tol: float) -> float:
    """The largest |got - want| (None, for layers not asked, must match None), asserted
    within ``tol`` absolute plus ``tol`` relative."""
    a = np.array(got, dtype=np.float64)  # None -> nan
    b = np.array(want, dtype=np.float64)
    assert a.shape == b.shape and np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol, equal_nan=True)
    return float(np.nanmax(np.abs(a - b)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_explain_norms_and_ablation_on_the_device_match_the_cpu(device: str, dtype: str) -> None:
    """What a head does, on the device: explain's four steps, the value-weighted norms and
    each head's ablation effect, against the same commands on the CPU in float32."""
    here, cpu = ("--device", device, "--dtype", dtype), ("--device", "cpu", "--dtype", "float32")
    tol = 1e-5 if dtype == "float32" else 5e-2
    head = ("explain", EXAMPLE, "--token", "it", "--layer", "5", "--head", "11", "--json")
    a, b = (json.loads(cli(*head, *where).stdout) for where in (here, cpu))
    assert a["device"].startswith(device.split(":")[0]) and a["dtype"] == dtype
    for key in ("scores", "weights", "value_norms", "contribution", "output", "head_shares"):
        # A half-precision score q·k rounds relative to the row's largest score (its
        # operands' scale), not to its own value: a score of -0.89 beside one of 23.4
        # came out -0.99 in bfloat16 on a CPU whose oneDNN kernels sum in another order.
        scale = max(1.0, float(np.nanmax(np.abs(np.array(b[key], dtype=np.float64))))) if key == "scores" else 1.0
        _close(a[key], b[key], tol * scale)
    norm = ("show", EXAMPLE, "--token", "it", "--measure", "norm", "--json")
    a, b = (json.loads(cli(*norm, *where).stdout) for where in (here, cpu))
    assert a["measure"] == b["measure"] == "norm"
    _close(a["weights"], b["weights"], tol)
    ablate = ("show", EXAMPLE, "--token", "it", "--ablate", "--layer", "3-5", "--json")
    a, b = (json.loads(cli(*ablate, *where).stdout) for where in (here, cpu))
    _close(a["ablation"]["effects"], b["ablation"]["effects"], tol)
    assert np.nanargmax(np.array(b["ablation"]["effects"], dtype=np.float64)) == 5 * 12 + 11  # L5 H11 matters most


def test_fused_gqa_kernel_keeps_no_score_matrix(device: str) -> None:
    """float32 with grouped-query attention through attnviz.nn.kernels: on CUDA the math
    backend is excluded (a fallback would materialise (H, L, S)); here the peak stays far
    below one (H, L, S) float32 score tensor. On the CPU, the flash backend alone runs it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnviz.nn.attention import Mask
    from attnviz.nn.rows import fused_attention

    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    b, h, g, n, d = 1, 8, 2, 2048 if dev.type == "cuda" else 512, 64
    q = torch.randn(b, h, n, d, generator=gen).to(dev)
    k, v = (torch.randn(b, g, n, d, generator=gen).to(dev) for _ in range(2))
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.cpu(), k.cpu().repeat_interleave(h // g, 1), v.cpu().repeat_interleave(h // g, 1), is_causal=True
    )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        out = fused_attention(q, k, v, Mask(causal=True))
        peak = torch.cuda.max_memory_allocated(dev) - base
        assert peak < b * h * n * n * 4 / 4  # well under one score matrix
    else:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # no math fallback allowed
            out = fused_attention(q, k, v, Mask(causal=True))
    torch.testing.assert_close(out.cpu(), expected, atol=1e-4, rtol=1e-4)


def test_weight_check_runs_on_the_device(device: str) -> None:
    from attnviz.errors import ModelLoadError
    from attnviz.io.checkpoint import check_tensors

    dev = torch.device(device)
    w = torch.randn(1000, 37, device=dev)
    check_tensors([("layers.0.w.weight", w)], "m")
    w[999, 36] = math.nan
    with pytest.raises(ModelLoadError, match="NaN, first in layer 2"):
        check_tensors([("layers.2.w.weight", w), ("layers.3.w.weight", w.clone())], "m")
