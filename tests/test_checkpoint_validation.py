"""Hostile checkpoints: a config that lies, weights that are missing, extra, integer or
NaN, no tokenizer, a refused pickle. Each must be refused with one clear error (exit 2)
before anything is built, by BOTH engines; none may produce an answer."""

from __future__ import annotations

import json
import math
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import EngineError, ModelLoadError
from attnviz.io.checkpoint import estimate_min_params, first_nonfinite_layer, read_safetensors_header, validate_config

from .builders import SPECS_BY_NAME, save_tiny

ENGINES = ("own", "hf")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["bert"], tmp_path_factory.mktemp("bert") / "ckpt")


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["gpt2"], tmp_path_factory.mktemp("gpt2") / "ckpt")


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(path: Path, **changes: Any) -> Path:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))
    return path


def edit_weights(path: Path, change: Any) -> Path:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def load(path: Path, engine: str) -> Any:
    from attnviz.engines import load_engine

    return load_engine(engine, str(path), "cpu")


def cli_error(*args: str) -> str:
    """Run the CLI in-process; it must fail with exit 2 and exactly one stderr line."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnviz: error: "), result.stderr
    return lines[0]


# --- config.json: types and ranges, by field name -----------------------------------


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("hidden_size", 0, "hidden_size is 0; it must be at least 1"),
        ("num_attention_heads", -3, "num_attention_heads is -3"),
        ("num_hidden_layers", "12", "num_hidden_layers must be a whole number, not str"),
        ("intermediate_size", 2.5, "intermediate_size must be a whole number, not float"),
        ("vocab_size", True, "vocab_size must be a whole number, not bool"),
        ("max_position_embeddings", 2**40, "max_position_embeddings is 1099511627776; it must be below"),
        ("layer_norm_eps", -1e-12, "layer_norm_eps is -1e-12; it must be a positive number"),
        ("layer_norm_eps", "tiny", "layer_norm_eps must be a number"),
        ("type_vocab_size", -1, "type_vocab_size is -1; it must be 0 or more"),
    ],
)
def test_config_fields_are_checked_by_name(field: str, value: Any, words: str) -> None:
    config = {"model_type": "bert", "hidden_size": 48, "num_attention_heads": 3, field: value}
    with pytest.raises(ModelLoadError, match=words.replace("(", r"\(").replace(".", r"\.")):
        validate_config(config)


def test_heads_that_do_not_divide_the_width() -> None:
    with pytest.raises(ModelLoadError, match="width 48 is not divisible by the 5 attention heads"):
        validate_config({"hidden_size": 48, "num_attention_heads": 5})
    with pytest.raises(ModelLoadError, match="not a multiple of num_key_value_heads=3"):
        validate_config({"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 3, "head_dim": 16})


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("field", "value"), [("hidden_size", 0), ("num_attention_heads", "three")])
def test_bad_config_is_exit_2_naming_the_field(
    tiny_bert: Path, tmp_path: Path, engine: str, field: str, value: Any
) -> None:
    path = edit_config(copy(tiny_bert, tmp_path / "m"), **{field: value})
    line = cli_error("show", "the cat sat", "--token", "cat", "--model", str(path), "-e", engine)
    assert field in line and "report it" not in line


# --- the config's size against the weight headers ---------------------------------


def test_the_estimate_is_a_lower_bound_of_real_models(tiny_bert: Path, tiny_gpt2: Path, minilm_dir: Path) -> None:
    # Every real checkpoint holds at least as many parameters as the bound its config implies.
    for path in (tiny_bert, tiny_gpt2, minilm_dir):
        config = json.loads((path / "config.json").read_text())
        have = sum(t.numel for t in read_safetensors_header(path / "model.safetensors"))
        need = estimate_min_params(config)
        assert need is not None and need <= have, (path, need, have)
    for name in ("albert", "albert-2groups", "llama", "distilbert", "electra"):
        config = SPECS_BY_NAME[name].make_config().to_dict()
        import transformers

        model = transformers.AutoModel.from_config(SPECS_BY_NAME[name].make_config())
        have = sum(p.numel() for p in model.parameters())
        assert estimate_min_params(config) <= have, name


@pytest.mark.parametrize("engine", ENGINES)
def test_absurd_layer_count_is_refused_before_building(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    path = edit_config(copy(tiny_bert, tmp_path / "m"), num_hidden_layers=100_000)
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match=r"num_hidden_layers=100000.*describes at least [\d,]+ parameters"):
        load(path, engine)
    # Building 100 000 blocks took minutes and gigabytes; the headers answer at once.
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("engine", ENGINES)
def test_fewer_layers_in_config_than_in_weights(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    path = edit_config(copy(tiny_bert, tmp_path / "m"), num_hidden_layers=1)
    with pytest.raises(ModelLoadError, match=r"num_hidden_layers=1, but the weights also hold .*layer\.1.*unused"):
        load(path, engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_missing_layer_is_refused(tiny_gpt2: Path, tmp_path: Path, engine: str) -> None:
    def drop_layer_1(t: dict) -> None:
        for name in [n for n in t if ".h.1." in n]:
            del t[name]

    path = edit_weights(copy(tiny_gpt2, tmp_path / "m"), drop_layer_1)
    with pytest.raises(ModelLoadError, match=r"n_layer=2, but the weights have no transformer\.h\.1"):
        load(path, engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_missing_weights_are_never_random_initialised(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    # The layer is there, one projection is not: --engine hf used to fill it with random
    # values and exit 0.
    def drop_query(t: dict) -> None:
        for name in [n for n in t if "layer.1.attention.self.query" in n]:
            del t[name]

    path = edit_weights(copy(tiny_bert, tmp_path / "m"), drop_query)
    line = cli_error("show", "the cat sat", "--token", "cat", "--model", str(path), "-e", engine)
    assert "lacks weights the model needs" in line and ("query" in line or "q_proj" in line) and ".1." in line


@pytest.mark.parametrize("engine", ENGINES)
def test_integer_weights_are_refused(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    import torch

    def quantize(t: dict) -> None:
        name = "bert.encoder.layer.0.attention.self.key.weight"
        t[name] = (t[name] * 100).to(torch.int8)

    path = edit_weights(copy(tiny_bert, tmp_path / "m"), quantize)
    line = cli_error("show", "the cat sat", "--token", "cat", "--model", str(path), "-e", engine)
    assert "layer.0.attention.self.key.weight is stored as I8 integers" in line
    assert "quantized" in line


def test_a_truncated_safetensors_file_is_bad_input(tiny_bert: Path, tmp_path: Path) -> None:
    path = copy(tiny_bert, tmp_path / "m")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="points past the end"):
        load(path, "own")
    (path / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(ModelLoadError, match="header of .* bytes is not plausible"):
        load(path, "hf")


# --- NaN and Inf ----------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_nan_weights_name_the_first_layer(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    def poison(t: dict) -> None:
        t["bert.encoder.layer.1.attention.self.query.weight"][0, 0] = math.nan
        t["bert.encoder.layer.1.output.dense.bias"][3] = math.inf

    path = edit_weights(copy(tiny_bert, tmp_path / "m"), poison)
    line = cli_error("show", "the cat sat", "--token", "cat", "--model", str(path), "-e", engine, "--json")
    assert "the weights hold NaN, first in layer 1" in line


@pytest.mark.parametrize("engine", ENGINES)
def test_inf_in_the_embeddings_comes_first(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    def poison(t: dict) -> None:
        t["bert.encoder.layer.0.attention.self.query.weight"][0, 0] = math.nan
        t["bert.embeddings.word_embeddings.weight"][7, 1] = -math.inf

    path = edit_weights(copy(tiny_bert, tmp_path / "m"), poison)
    with pytest.raises(ModelLoadError, match="the weights hold infinite values, first in the embeddings"):
        load(path, engine)


def test_first_nonfinite_attention_layer() -> None:
    weights = np.full((3, 2, 1, 4), 0.25, dtype=np.float32)  # (N, H, Q, S)
    assert first_nonfinite_layer(weights, (0, 2, 5)) is None
    weights[2, 1, 0, 3] = np.nan
    weights[1, 0, 0, 0] = np.inf
    assert first_nonfinite_layer(weights, (0, 2, 5)) == 2


def test_nan_attention_rows_are_an_error_naming_the_layer(own_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A finite checkpoint can still overflow (float16); the rows are checked after the pass.
    from .helpers import inspect

    real = own_engine.forward

    def overflowing(tokens: Any, layers: Any = None, queries: Any = None, **options: Any) -> Any:
        out = real(tokens, layers, queries, **options)
        chosen = list(range(len(out.attentions))) if layers is None else list(layers)
        if 3 in chosen:
            i = chosen.index(3)
            out.attentions[i] = out.attentions[i].clone()
            out.attentions[i][0, 5, 1, 2] = float("nan")
        return out

    monkeypatch.setattr(own_engine, "forward", overflowing)
    with pytest.raises(EngineError, match="attention weights of layer 3 hold NaN"):
        inspect("The cat sat on the mat", own_engine)
    # Rows of layers before the bad one are still fine on their own.
    assert inspect("The cat sat on the mat", own_engine, "0-2").weights.shape[0] == 3


def test_json_never_prints_bare_nan(own_engine: Any) -> None:
    from dataclasses import replace

    from .helpers import inspect

    att = inspect("The cat sat", own_engine, "0")
    weights = att.weights.copy()
    weights[0, 0, 0, 0] = np.nan
    weights[0, 0, 0, 1] = np.inf
    text = replace(att, weights=weights).to_json(0)
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert data["weights"][0][0][:2] == [None, None]


# --- tokenizer ------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_no_tokenizer_is_exit_2_naming_the_files(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    path = copy(tiny_bert, tmp_path / "m")
    for f in path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab")):
            f.unlink()
    line = cli_error("show", "the cat sat", "--token", "cat", "--model", str(path), "-e", engine)
    assert "has no tokenizer (looked for tokenizer.json, vocab.txt, vocab.json + merges.txt" in line


# --- pickles --------------------------------------------------------------------------


class _Payload:
    def __reduce__(self) -> Any:
        return (print, ("this code ran while loading",))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_refused_pickle_is_one_accurate_line(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    import torch
    from safetensors.torch import load_file

    path = copy(tiny_bert, tmp_path / "m")
    tensors: dict[str, Any] = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    torch.save({**tensors, "bert.pooler.dense.weight": _Payload()}, path / "pytorch_model.bin")
    done = subprocess.run(
        [sys.executable, "-m", "attnviz", "show", "the cat sat", "--token", "cat", "--model", str(path), "-e", engine],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "this code ran" not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "refused to unpickle" in lines[0] and "(weights_only)" in lines[0]
    assert "corrupt" not in lines[0]


def test_pickle_module_is_the_one_torch_raises() -> None:
    # The refusal is recognised by type, not by message text.
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"x": _Payload()}, buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(buf, weights_only=True)
