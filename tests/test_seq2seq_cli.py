"""The command line on encoder-decoders (--target-text, --target-file, --part) and on
sentence pairs (--pair), through typer's CliRunner on tiny saved checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.example import EXAMPLE

from .builders import SPECS_BY_NAME, save_tiny
from .helpers import one_error_line

runner = CliRunner()
SOURCE = f"{EXAMPLE}."
TARGET = "the cat sat on the mat"


def run(*args: str, stdin: str | None = None):
    return runner.invoke(app, list(args), input=stdin, env={"NO_COLOR": "1", "COLUMNS": "200"})


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("s2s-cli")
    return {name: save_tiny(SPECS_BY_NAME[name], root / name) for name in ("t5", "bart")}


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_show_cross_attention_agrees_between_engines(name: str, saved: dict[str, Path]) -> None:
    """The issue's "done when": show SOURCE --target-text TARGET --part cross --token WORD,
    on both engines, agreeing."""
    outs = {}
    for engine in ("own", "hf"):
        args = ("show", SOURCE, "--target-text", TARGET, "--part", "cross", "--token", "cat")
        text = run(*args, "--model", str(saved[name]), "--engine", engine, "--device", "cpu")
        assert text.exit_code == 0, text.output
        assert "cross-attention: decoder token → source token" in text.stdout
        assert "'cat' (token" in text.stdout and "→ each source token" in text.stdout
        data = run(*args, "--model", str(saved[name]), "--engine", engine, "--device", "cpu", "--json")
        assert data.exit_code == 0, data.output
        outs[engine] = json.loads(data.stdout)
    own, hf = outs["own"], outs["hf"]
    assert own["part"] == "cross" and own["query_token"] == "cat"
    assert own["text"] == TARGET and own["key_text"] == SOURCE
    assert own["key_tokens"] == hf["key_tokens"] and "animal" in own["key_tokens"]
    weights = np.array(own["weights"])  # (layers, heads, source tokens)
    assert weights.shape == (3, own["provenance"]["num_heads"], len(own["key_tokens"]))
    assert np.allclose(weights.sum(-1), 1, atol=1e-5)
    assert np.abs(weights - np.array(hf["weights"])).max() <= 1e-5


def test_parts_default_and_decoder_is_causal(saved: dict[str, Path]) -> None:
    model = ("--model", str(saved["t5"]), "--device", "cpu", "--json")
    default = json.loads(run("show", SOURCE, "--target-text", TARGET, "--token", "sat", *model).stdout)
    assert default["part"] == "cross"  # with a decoder text, cross-attention by default
    decoder = json.loads(
        run("show", SOURCE, "--target-text", TARGET, "--part", "decoder", "--token", "sat", *model).stdout
    )
    assert decoder["part"] == "decoder" and decoder["provenance"]["causal"] is True
    assert "key_tokens" not in decoder  # self-attention: keys are the queries' tokens
    sat = decoder["query_index"]
    assert (np.array(decoder["weights"])[..., sat + 1 :] == 0).all()  # never a later target token
    encoder = json.loads(run("show", SOURCE, "--token", "animal", *model).stdout)
    assert encoder["part"] == "encoder" and encoder["provenance"]["num_layers"] == 2  # the encoder's 2 layers


def test_target_file_and_stdin(saved: dict[str, Path], tmp_path: Path) -> None:
    model = ("--model", str(saved["bart"]), "--device", "cpu", "--json", "--token", "mat")
    (tmp_path / "target.txt").write_text(TARGET + "\n", encoding="utf-8")
    from_file = json.loads(run("show", SOURCE, "--target-file", str(tmp_path / "target.txt"), *model).stdout)
    from_stdin = json.loads(run("show", SOURCE, "--target-text", "-", *model, stdin=TARGET).stdout)
    assert from_file["text"] == from_stdin["text"] == TARGET
    assert from_file["weights"] == from_stdin["weights"]


def test_export_draws_cross_attention_matrices(saved: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cross.png"
    result = run(
        "export", SOURCE, "--target-text", TARGET, "--part", "cross", "--view", "matrix",
        "--model", str(saved["bart"]), "--device", "cpu", "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    token = tmp_path / "cat.svg"
    result = run(
        "export", SOURCE, "--target-text", TARGET, "--token", "cat",
        "--model", str(saved["t5"]), "--device", "cpu", "-o", str(token),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "cross-attention" in token.read_text(encoding="utf-8")


def test_compare_cross_attention(saved: dict[str, Path]) -> None:
    args = ("compare", SOURCE, "--target-text", TARGET, "--token", "cat", "--target", "animal")
    result = run(*args, "--model", str(saved["t5"]), "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert len(rows) == 3 * 3  # 3 decoder layers × 3 heads
    assert all(row["self"] is None and row["distance"] is None for row in rows)  # no positions to compare
    assert all(0 < row["targets"]["animal"] < 1 for row in rows)  # "animal" is found in the source
    table = run(*args, "--model", str(saved["t5"]), "--device", "cpu")
    assert table.exit_code == 0 and "–" in table.stdout and "→ each source token" in table.stdout
    line = one_error_line(run(*args, "--model", str(saved["t5"]), "--device", "cpu", "--sort", "distance"), 2)
    assert "--sort weight" in line


def test_check_covers_every_part(saved: dict[str, Path]) -> None:
    result = run("check", "--model", str(saved["bart"]), "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] and [p["part"] for p in data["parts"]] == ["encoder", "decoder", "cross"]
    assert [len(p["attention"]) for p in data["parts"]] == [2, 3, 3]
    assert [p["num_heads"] for p in data["parts"]] == [3, 4, 4]
    table = run("check", "--model", str(saved["bart"]), "--device", "cpu", "--part", "cross")
    assert table.exit_code == 0 and "cross 2" in table.stdout and "encoder 0" not in table.stdout
    assert "PASS" in table.stdout


def test_encoder_decoder_mistakes_are_one_line_with_a_hint(saved: dict[str, Path]) -> None:
    t5 = ("--model", str(saved["t5"]), "--device", "cpu")
    line = one_error_line(run("show", SOURCE, "--part", "cross", "--token", "cat", *t5), 2)
    assert "needs the decoder text" in line and "--target-text" in line
    line = one_error_line(run("show", SOURCE, "--target-text", TARGET, "--token", "zebra", *t5), 2)
    assert "not in the decoder text" in line
    line = one_error_line(
        run("show", SOURCE, "--target-text", TARGET, "--target-file", "x.txt", "--token", "cat", *t5), 2
    )
    assert "not both" in line
    line = one_error_line(run("show", SOURCE, "--target-file", "/no/such/file", "--token", "cat", *t5), 2)
    assert "does not exist" in line
    line = one_error_line(run("show", SOURCE, "--pair", "It was.", "--token", "cat", *t5), 2)
    assert "encoder-decoder" in line and "--target-text" in line
    line = one_error_line(run("show", SOURCE, "--target-text", TARGET, "--token", "cat", "--words", *t5), 2)
    assert "not implemented for cross-attention" in line and "--part encoder or decoder" in line
    mean = run("show", SOURCE, "--target-text", TARGET, "--token", "cat", "--heads", "mean", "--json", *t5)
    assert mean.exit_code == 0, mean.output  # head aggregates work on cross-attention
    assert len(json.loads(mean.stdout)["weights"][0]) == 3 + 1  # 3 heads and the mean
    line = one_error_line(run("show", EXAMPLE, "--part", "cross", "--token", "it", "--device", "cpu"), 2)
    assert "not an encoder-decoder" in line and "--part" in line
    line = one_error_line(run("show", EXAMPLE, "--target-text", "x", "--token", "it", "--device", "cpu"), 2)
    assert "needs an encoder-decoder" in line and "--pair" in line


def test_show_and_compare_a_sentence_pair() -> None:
    args = ("show", "The cat sat on the mat.", "--pair", "It was too tired to move.", "--token", "tired")
    text = run(*args, "--layer", "0", "--device", "cpu")
    assert text.exit_code == 0, text.output
    assert "sentence pair: ┃ marks where sentence B (token type 1) starts, at token 9 ('It')" in text.stdout
    data = json.loads(run(*args, "--device", "cpu", "--json").stdout)
    assert data["pair_start"] == 9 and data["type_ids"][8:10] == [0, 1] and data["query_index"] == 12
    rows = run("compare", *args[1:], "--target", "cat", "--device", "cpu", "--json")
    assert rows.exit_code == 0, rows.output
    assert all(row["self"] is not None for row in json.loads(rows.stdout)["rows"])


def test_html_page_takes_parts_and_a_pair(saved: dict[str, Path], tmp_path: Path) -> None:
    page = tmp_path / "view.html"
    args = ("export", SOURCE, "--target-text", TARGET, "--model", str(saved["t5"]), "--device", "cpu", "-o", str(page))
    # A short encoder-decoder's cross-attention page needs no --rows --token (#39): its
    # decoder tokens' rows are a few kilobytes, so the page holds every one of them.
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "row mode" in result.output and page.exists()
    assert all(word in page.read_text(encoding="utf-8") for word in SOURCE.split()[:2])
    page.unlink()
    pair = run("export", "The cat sat.", "--pair", "It was tired.", "--device", "cpu", "-o", str(page), "--layer", "0")
    assert pair.exit_code == 0, pair.output
    assert "tired" in page.read_text(encoding="utf-8")
