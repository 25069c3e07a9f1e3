"""Hostile files outside the fuzzer's reach (issue 25): shard layouts that would give
silently different weights, JSON inputs nested 100,000 deep or holding a 5,000-digit
number, tokenizers that do not fit the model. Each is one clear line, exit 2, from both
engines, and never an answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import ModelLoadError, UsageError
from attnviz.example import EXAMPLE
from attnviz.io.jsonread import loads

from .builders import SPECS_BY_NAME, save_tiny
from .helpers import one_error_line

ENGINES = ("own", "hf")
DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 5000


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(SPECS_BY_NAME["bert"], tmp_path_factory.mktemp("bert") / "ckpt")


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def error_line(*args: str) -> str:
    return one_error_line(CliRunner().invoke(app, list(args)), 2)


def show(path: Path, engine: str = "own") -> list[str]:
    return ["show", "the cat sat", "--token", "cat", "--layer", "0", "--model", str(path), "-e", engine]


# --- the bounded JSON reader ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (DEEP, "nests more than 64 levels deep"),
        ("[" * 70 + "]" * 70, "nests more than 64 levels deep"),
        ('{"a": ' + HUGE + "}", "holds a number of 5,000 characters"),
        ('{"a": 1.' + HUGE + "}", "holds a number of 5,002 characters"),
        ('{"a": 1,}', "is not valid JSON"),
        (b"\xff{}", "is not UTF-8"),
        ('{"a": NaN}', "holds NaN, which is not JSON"),
        ("[-Infinity]", "holds -Infinity, which is not JSON"),
        ('{"a": 1e99999}', "holds 1e99999, which no float64 holds"),
    ],
)
def test_the_json_reader_refuses_with_one_error(text: Any, words: str) -> None:
    with pytest.raises(UsageError, match=words) as info:
        loads(text, "f.json")
    assert str(info.value).startswith("f.json ")
    assert loads('{"a": [1, 2.5, {"b": null}]}', "f.json") == {"a": [1, 2.5, {"b": None}]}
    assert loads("[" * 64 + "]" * 64, "f.json") is not None


def test_the_json_reader_refuses_more_than_its_size() -> None:
    with pytest.raises(UsageError, match="is 101 bytes; more than 100 is refused"):
        loads(b" " * 99 + b"{}", "f.json", max_bytes=100)


# --- config.json, shard index, safetensors header --------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("value", "words"), [(HUGE, "holds a number of 5,000 characters"), (DEEP, "nests more")])
def test_config_json_hostile_numbers_and_depth_blame_config_json(
    tiny_bert: Path, tmp_path: Path, engine: str, value: str, words: str
) -> None:
    path = copy(tiny_bert, tmp_path / "m")
    text = (path / "config.json").read_text()
    (path / "config.json").write_text(text.replace('"vocab_size": 101', f'"vocab_size": {value}', 1))
    assert value in (path / "config.json").read_text()
    line = error_line(*show(path, engine))
    assert f"{path}/config.json {words}" in line, line


def shard(
    path: Path, move: set[str], index_of: dict[str, str] | None = None, dup: dict[str, Any] | None = None
) -> None:
    """Split model.safetensors into two shards (``move`` goes into the second) with an index.

    ``index_of`` overrides the index's shard for some names; ``dup`` adds tensors to the
    second shard (a name the first holds too)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    first = {k: v for k, v in tensors.items() if k not in move}
    second = {k: v for k, v in tensors.items() if k in move} | (dup or {})
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    save_file(first, str(path / names[0]), metadata={"format": "pt"})
    save_file(second, str(path / names[1]), metadata={"format": "pt"})
    mapping = {k: names[0] for k in first} | {k: names[1] for k in second if k not in first}
    mapping.update(index_of or {})
    index = {"metadata": {}, "weight_map": mapping}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


KEY = "bert.encoder.layer.1.attention.self.key.weight"
QUERY = "bert.encoder.layer.1.attention.self.query.weight"


def test_a_consistent_sharded_checkpoint_loads_and_agrees(tiny_bert: Path, tmp_path: Path) -> None:
    from attnviz import inspect

    path = copy(tiny_bert, tmp_path / "m")
    shard(path, {KEY})
    sharded = inspect("the cat sat", token="cat", model=str(path))
    whole = inspect("the cat sat", token="cat", model=str(tiny_bert))
    assert (sharded.weights == whole.weights).all()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tensor_in_two_shards_is_refused(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    # The index names shard 1; shard 2 holds other values: reading shard 2 was off by 0.87
    # and `check` passed, because transformers reads the same files.
    from safetensors.torch import load_file

    path = copy(tiny_bert, tmp_path / "m")
    other = load_file(str(path / "model.safetensors"))[KEY] + 0.5
    shard(path, {QUERY}, dup={KEY: other})
    line = error_line(*show(path, engine))
    assert f"tensor {KEY!r} is in two shards, model-00001-of-00002.safetensors and model-00002" in line, line


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tensor_outside_the_index_mapping_is_refused(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    path = copy(tiny_bert, tmp_path / "m")
    shard(path, {KEY, QUERY}, index_of={KEY: "model-00001-of-00002.safetensors"})
    line = error_line(*show(path, engine))
    assert "model-00002-of-00002.safetensors holds" in line and "index.json maps it to model-00001" in line, line
    index = json.loads((path / "model.safetensors.index.json").read_text())
    del index["weight_map"][KEY]
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "does not name it" in error_line(*show(path, engine))


def test_an_index_naming_a_tensor_no_shard_holds_is_refused(tiny_bert: Path, tmp_path: Path) -> None:
    path = copy(tiny_bert, tmp_path / "m")
    shard(path, {KEY}, index_of={"bert.encoder.layer.1.extra.weight": "model-00002-of-00002.safetensors"})
    assert "which does not hold it" in error_line(*show(path))


@pytest.mark.parametrize("value", [DEEP, HUGE])
def test_a_hostile_shard_index_is_refused(tiny_bert: Path, tmp_path: Path, value: str) -> None:
    path = copy(tiny_bert, tmp_path / "m")
    shard(path, {KEY})
    (path / "model.safetensors.index.json").write_text('{"metadata": {"total_size": ' + value + "}}")
    line = error_line(*show(path))
    assert "model.safetensors.index.json" in line and ("nests more" in line or "a number of 5,000" in line), line


@pytest.mark.parametrize("value", [DEEP, HUGE])
def test_a_hostile_safetensors_header_is_refused(tiny_bert: Path, tmp_path: Path, value: str) -> None:
    import struct

    path = copy(tiny_bert, tmp_path / "m")
    header = ('{"__metadata__": {"x": ' + value + "}}").encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    line = error_line(*show(path))
    assert "model.safetensors: the safetensors header" in line, line


@pytest.mark.parametrize("engine", ENGINES)
def test_integer_biases_are_refused_at_the_header(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    path = copy(tiny_bert, tmp_path / "m")
    tensors = load_file(str(path / "model.safetensors"))
    name = "bert.encoder.layer.0.attention.self.key.bias"
    tensors[name] = (tensors[name] * 100).to(torch.int8)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    line = error_line(*show(path, engine))
    assert f"bias {name} is stored as I8 integers" in line, line


# --- JSONL corpus and coreference files ---------------------------------------------------


@pytest.mark.parametrize("suffix", ["jsonl", "coref"])
@pytest.mark.parametrize("value", [DEEP, HUGE])
def test_hostile_jsonl_lines_are_refused_naming_the_line(tmp_path: Path, suffix: str, value: str) -> None:
    from attnviz.corpus.sources import read_coref, read_corpus

    path = tmp_path / "c.jsonl"
    fields = '"pronoun": "it", "referent": "x", "candidates": ["x"]'
    path.write_text('{"text": "x it", ' + fields + '}\n{"text": "x", "n": ' + value + "}\n")
    reader = read_corpus if suffix == "jsonl" else read_coref
    with pytest.raises(UsageError, match=r"c\.jsonl:2: (nests more|holds a number)"):
        list(reader(str(path)))


# --- tokenizers that do not fit the model -------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_token_ids_past_the_vocabulary_are_refused(tiny_bert: Path, tmp_path: Path, engine: str) -> None:
    path = copy(tiny_bert, tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    tok = json.loads((path / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    cat = vocab["cat"]
    config["vocab_size"] = cat  # "cat" and every id after it fall outside the embeddings
    (path / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    name = "bert.embeddings.word_embeddings.weight"
    tensors[name] = tensors[name][:cat].contiguous()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    line = error_line(*show(path, engine))
    assert "the tokenizer gives token" in line and f"vocabulary has {cat} entries (0..{cat - 1})" in line, line


def test_an_empty_vocabulary_is_refused(tiny_bert: Path, tmp_path: Path) -> None:
    path = copy(tiny_bert, tmp_path / "m")
    tok = json.loads((path / "tokenizer.json").read_text())
    tok["model"]["vocab"] = {}
    tok["added_tokens"] = []
    tok["post_processor"] = None
    (path / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ModelLoadError):
        from attnviz.tokens import load_tokenizer

        load_tokenizer(path)
    assert "empty vocabulary" in error_line(*show(path)) or "cannot read" in error_line(*show(path))


# --- output names -----------------------------------------------------------------------


def test_a_252_byte_name_of_4_byte_characters_is_written(tmp_path: Path) -> None:
    # The temp name took the first 100 characters: 400 bytes, over 255, after the model work.
    from attnviz.io.safeio import temp_stem

    name = "😀" * 62 + ".svg"
    assert len(name.encode()) == 252
    assert len(temp_stem(name).encode()) <= 100 and name.startswith(temp_stem(name))
    out = tmp_path / name
    result = CliRunner().invoke(app, ["export", "The cat sat", "--token", "cat", "--layer", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 0 and sorted(p.name for p in tmp_path.iterdir()) == [name]


# --- check refuses what show refuses ----------------------------------------------------


def test_check_refuses_an_empty_sentence_before_loading(no_model: list[str]) -> None:
    line = error_line("check", "-s", "a", "-s", " ")
    assert "--sentence number 2 is empty" in line and no_model == []


@pytest.mark.parametrize("command", ["check", "show"])
def test_part_on_a_one_stack_model_is_refused_by_check_as_by_show(tmp_path: Path, command: str) -> None:
    path = save_tiny(SPECS_BY_NAME["gpt2"], tmp_path / "gpt2")
    args = ["the cat sat", "--token", "cat"] if command == "show" else []
    line = error_line(command, *args, "--model", str(path), "--part", "encoder")
    assert "has no 'encoder' attention: it is not an encoder-decoder" in line


# --- a text far longer than the positions -------------------------------------------------


def test_a_15_mib_text_is_refused_before_it_is_tokenized_whole(own_engine: Any) -> None:
    # It was tokenized whole first (4.1 M tokens, 15 s, 3.1 GB), then refused.
    import time

    text = f"{EXAMPLE}. " * 260_000
    assert len(text) > 15 * 2**20
    start = time.perf_counter()
    with pytest.raises(UsageError, match=r"more than 512 tokens \(\d+ in its first [\d,]+ characters"):
        own_engine.tokenize(text)
    assert time.perf_counter() - start < 2
    fits = "the cat sat " * 40  # 120 words: under 512 tokens, tokenized whole as before
    assert len(own_engine.tokenize(fits)) == 122


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_1_gib_tokenizer_file_is_refused_by_its_size_unread(
    tiny_bert: Path, tmp_path: Path, engine: str, name: str
) -> None:
    """A 1 GiB tokenizer.json was parsed whole (2.3 GB) before its refusal (issue 25's
    round, rerun in issue 38): the size is read by stat first, and the file never is.
    Sparse: 1 GiB of zeros on no disk. The tokenizers library parses in Rust, out of
    tracemalloc's sight: a child process's peak RSS says what the refusal read."""
    import subprocess
    import sys

    ckpt = copy(tiny_bert, tmp_path / "ckpt")
    with (ckpt / name).open("r+b") as f:
        f.truncate(1 << 30)
    line = error_line("show", EXAMPLE, "--token", "cat", "--model", str(ckpt), "--engine", engine)
    assert f"{ckpt / name} is 1,073,741,824 bytes" in line and "not plausible for this file" in line, line
    if name != "tokenizer.json" or engine != "own":
        return
    probe = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from attnviz.tokens import load_tokenizer\n"
        "try:\n    load_tokenizer(Path(sys.argv[1]))\nexcept Exception as exc:\n    print(type(exc).__name__)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )

    def peak(directory: Path) -> tuple[str, int]:
        done = subprocess.run(
            [sys.executable, "-c", probe, str(directory)], capture_output=True, text=True, timeout=120
        )
        *kind, kb = done.stdout.split()
        return " ".join(kind), int(kb) * 1024

    (kind, refused), (_, plain) = peak(ckpt), peak(tiny_bert)
    assert kind == "ModelLoadError" and refused < plain + 64 * 2**20, (refused, plain)  # 1 GiB read: > 1 GB more
