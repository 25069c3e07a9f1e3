"""The attnviz command line, through typer's CliRunner and one real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.example import EXAMPLE

from .helpers import one_error_line, save_tiny_bert

runner = CliRunner()


def run(*args: str, **env: str):
    return runner.invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "200", **env})


def test_show_prints_every_layer_and_head() -> None:
    result = run("show", EXAMPLE, "--token", "it")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for layer in range(6):
        assert f"layer {layer} · 'it' (token 10)" in out
    assert out.count(" h11 ") == 6
    # Layer 3, head 1 sends most of "it"'s attention to "animal".
    layer3 = out.split("layer 3 ·")[1].split("layer 4 ·")[0]
    h1 = next(line for line in layer3.splitlines() if line.strip().startswith("h1 "))
    assert "animal 0.64" in h1
    # The summary names the five strongest links over all 72 heads, leaving out special
    # tokens, punctuation, "it" itself and its neighbours; recomputed here from the JSON.
    data = json.loads(run("show", EXAMPLE, "--token", "it", "--json").stdout)
    q = data["query_index"]
    best = sorted(
        ((-w, layer, head, i) for layer, heads in enumerate(data["weights"]) for head, row in enumerate(heads)
         for i, w in enumerate(row)
         if not data["special"][i] and abs(i - q) > 1 and any(c.isalnum() for c in data["tokens"][i])),
    )[:5]  # fmt: skip
    summary = out.split("strongest links of 'it', not to special tokens, punctuation or neighbours:")[1]
    lines = [line.split() for line in summary.strip().splitlines()]
    assert len(lines) == 5
    for (w, layer, head, i), line in zip(best, lines):
        assert line == ["layer", str(layer), "head", str(head), "→", repr(data["tokens"][i]), f"{-w:.2f}"]
    # The example's coreference heads surface without any --target.
    assert "layer 3 head 1   → 'animal'" in summary and "layer 5 head 11  → 'animal'" in summary


def test_show_values_prints_numbers(own_engine) -> None:
    from .helpers import inspect

    result = run("show", EXAMPLE, "--token", "it", "--layer", "3", "--values")
    assert result.exit_code == 0, result.output
    assert "layer 4" not in result.stdout
    tokens = own_engine.tokenize(EXAMPLE)
    weight = inspect(tokens, own_engine, 3, (10,)).rows(10)[0, 1, 2]
    assert f"{weight:.2f}".lstrip("0") + "◆" in result.stdout


def test_show_json_schema() -> None:
    result = run("show", EXAMPLE, "--token", "it", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["tokens"][data["query_index"]] == "it"
    assert data["query_index"] == 10
    assert (data["model"], data["engine"], data["device"]) == ("all-MiniLM-L6-v2", "own", "cpu")
    weights = data["weights"]
    assert len(weights) == 6 and all(len(layer) == 12 for layer in weights)
    assert all(len(row) == len(data["tokens"]) for layer in weights for row in layer)
    assert all(abs(sum(row) - 1) < 1e-4 for layer in weights for row in layer)
    assert weights[3][1][data["tokens"].index("animal")] > 0.6


def test_json_engines_agree() -> None:
    own = json.loads(run("show", EXAMPLE, "--token", "it", "--json").stdout)
    hf = json.loads(run("show", EXAMPLE, "--token", "it", "--json", "--engine", "hf").stdout)
    assert hf["engine"] == "hf"
    diff = max(
        abs(a - b) for la, lb in zip(own["weights"], hf["weights"]) for ra, rb in zip(la, lb) for a, b in zip(ra, rb)
    )
    assert diff <= 1e-5


def test_split_word_is_the_mean_of_its_pieces() -> None:
    """One rule in every view: a word split into pieces is one query, its row the mean of
    its pieces' rows; checked against each piece's own rows (--index)."""
    sentence, word = "Antidisestablishmentarianism is long", "antidisestablishmentarianism"
    data = json.loads(run("show", sentence, "--token", word, "--layer", "0", "--json").stdout)
    pieces = data["query_indices"]
    assert len(pieces) > 1 and data["query_index"] == pieces[0] and "mean" in data["query_rule"]
    assert data["query_token"] == "Antidisestablishmentarianism"
    rows = [np.array(json.loads(run("show", sentence, "--index", str(i), "--layer", "0", "--json").stdout)["weights"])
            for i in pieces]  # fmt: skip
    np.testing.assert_allclose(np.array(data["weights"]), np.mean(rows, axis=0), atol=2e-6)
    text = run("show", sentence, "--token", word, "--layer", "0").stdout
    assert f"(tokens {pieces[0]}-{pieces[-1]}, averaged)" in text
    assert text.count("layer 0 ·") == 1  # one heatmap for the word, not one per piece


def test_index_and_occurrence() -> None:
    by_index = json.loads(run("show", "the cat saw the dog", "--index", "4", "--layer", "0", "--json").stdout)
    by_occurrence = json.loads(
        run("show", "the cat saw the dog", "--token", "the", "-n", "2", "--layer", "0", "--json").stdout
    )
    assert by_index["query_index"] == by_occurrence["query_index"] == 4
    assert by_index["weights"] == by_occurrence["weights"]


@pytest.mark.parametrize("command", ["show", "compare"])
def test_word_colon_n_picks_an_occurrence_in_every_command(command: str) -> None:
    # --token WORD:N is the same query as --token WORD -n N (it was read as the text
    # "the:2" by compare and export, which only show's repeatable --token parsed).
    sentence = "the cat saw the dog"
    colon = run(command, sentence, "--token", "the:2", "--layer", "0", "--json")
    flag = run(command, sentence, "--token", "the", "-n", "2", "--layer", "0", "--json")
    assert colon.exit_code == flag.exit_code == 0, colon.output
    assert json.loads(colon.stdout) == json.loads(flag.stdout)
    assert "occurs 2 times" in one_error_line(run(command, sentence, "--token", "the:3", "--layer", "0"), 2)


def test_export_takes_word_colon_n(tmp_path: Path) -> None:
    colon, flag = tmp_path / "colon.svg", tmp_path / "flag.svg"
    assert run("export", "the cat saw the dog", "-t", "the:2", "-l", "0", "-o", str(colon)).exit_code == 0
    assert run("export", "the cat saw the dog", "-t", "the", "-n", "2", "-l", "0", "-o", str(flag)).exit_code == 0
    assert colon.read_bytes() == flag.read_bytes()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["show", "", "--token", "it"], "the sentence is empty"),
        (["show", EXAMPLE, "--token", "cat"], "'cat' is not in the sentence; its tokens are: 0:[CLS] 1:The"),
        (["show", "the cat saw the dog", "--token", "the"], "occurs 2 times"),
        (["show", EXAMPLE, "--token", "it", "--layer", "6"], "layer 6 is out of range: this model has 6 layers"),
        (["show", EXAMPLE, "--token", "it", "--layer", "two"], "cannot read layer 'two'"),
        (["show", EXAMPLE, "--index", "99"], "token index 99 is out of range"),
        (["show", EXAMPLE], "say which token to inspect"),
        (["show", EXAMPLE, "--token", "it", "--index", "2"], "not both"),
        (["show", EXAMPLE, "--token", "it", "--engine", "fast"], "--engine must be own or hf, not 'fast'"),
        (["show", EXAMPLE, "--token", "it", "--device", "tpu"], "device"),
        (["show", EXAMPLE, "--token", "it", "--model", "/no/such/dir"], "no model directory at '/no/such/dir'"),
        (["show", EXAMPLE, "--token", "it", "--model", "nobody-xyz/no-such-model"], "could not be downloaded"),
        (["show", EXAMPLE, "--token", "it", "--bogus"], "No such option: --bogus"),
        (["show"], "give a text (or --file PATH)"),  # no text at all is said first (issue 24)
        (["nosuchcommand"], "No such command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    line = one_error_line(run(*args), 2)
    assert needle in line
    assert "hint:" in line


def test_missing_cuda_is_a_clear_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = one_error_line(run("show", EXAMPLE, "--token", "it", "--device", "cuda"), 2)
    assert "CUDA is not available" in line


def test_corrupt_models(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no config.json" in one_error_line(run("show", EXAMPLE, "-t", "it", "-m", str(empty)), 2)

    bad_json = save_tiny_bert(tmp_path / "bad_json")
    (bad_json / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in one_error_line(run("show", EXAMPLE, "-t", "it", "-m", str(bad_json)), 2)

    truncated = save_tiny_bert(tmp_path / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    for engine in ("own", "hf"):
        line = one_error_line(run("show", EXAMPLE, "-t", "it", "-m", str(truncated), "-e", engine), 2)
        assert "truncated" in line or "cannot load" in line

    no_weights = save_tiny_bert(tmp_path / "no_weights")
    weights = no_weights / "model.safetensors"
    weights.unlink()
    assert "has no weights" in one_error_line(run("show", EXAMPLE, "-t", "it", "-m", str(no_weights)), 2)

    bad_tokenizer = save_tiny_bert(tmp_path / "bad_tokenizer")
    (bad_tokenizer / "tokenizer.json").write_text("[]")
    assert "tokenizer" in one_error_line(run("show", EXAMPLE, "-t", "it", "-m", str(bad_tokenizer)), 2)


def test_tiny_model_directory_works(tmp_path: Path) -> None:
    save_tiny_bert(tmp_path)
    result = run("show", EXAMPLE, "--token", "it", "--model", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "2 layers × 3 heads" in result.stdout
    assert "layer 1 ·" in result.stdout and "layer 2 ·" not in result.stdout


def test_debug_shows_the_traceback() -> None:
    result = run("show", EXAMPLE, "--token", "cat", "--debug")
    assert result.exit_code != 0
    assert result.exception is not None and type(result.exception).__name__ == "TokenNotFoundError"


def test_version_and_help() -> None:
    from attnviz import __version__

    assert run("--version").stdout.strip() == f"attnviz {__version__}"
    assert "--token" in run("show", "--help").stdout


def test_installed_entry_point_smoke() -> None:
    """The console script a user runs, as a real process."""
    exe = Path(sys.executable).with_name("attnviz")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "attnviz"]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}
    done = subprocess.run(
        [*cmd, "show", EXAMPLE, "--token", "it", "--layer", "3"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "animal 0.64" in done.stdout
    failed = subprocess.run(
        [*cmd, "show", EXAMPLE, "--token", "zebra"], capture_output=True, text=True, env=env, timeout=120
    )
    assert failed.returncode == 2
    assert failed.stdout == ""
    assert failed.stderr.count("\n") == 1 and "'zebra' is not in the sentence" in failed.stderr
    module = subprocess.run([sys.executable, "-m", "attnviz", "--version"], capture_output=True, text=True, timeout=60)
    assert module.returncode == 0 and module.stdout.startswith("attnviz ")


def test_interrupt_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    from attnviz.cli import errors

    with pytest.raises(SystemExit) as info, errors(debug=False):
        raise KeyboardInterrupt
    assert info.value.code == 130
    assert capsys.readouterr().err == "attnviz: error: interrupted\n"


def test_unexpected_errors_are_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    from attnviz.cli import errors

    with pytest.raises(SystemExit) as info, errors(debug=False):
        raise RuntimeError("CUDA out of memory\nmore detail")
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError: CUDA out of memory" in err and "--debug" in err


def test_show_on_a_grouped_query_decoder(tmp_path: Path) -> None:
    """Decoders say they are causal and mask later tokens; GQA heads name their kv group."""
    from .builders import SPECS_BY_NAME, save_tiny

    save_tiny(SPECS_BY_NAME["qwen2"], tmp_path)
    result = run("show", EXAMPLE, "--token", "it", "--model", str(tmp_path), "--layer", "1")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "causal (decoder)" in out and "4 query heads share 2 key/value heads" in out
    assert "h1 (kv0)" in out and "h2 (kv1)" in out
    data = json.loads(run("show", EXAMPLE, "--token", "it", "--model", str(tmp_path), "--json").stdout)
    q = data["query_index"]
    assert all(w == 0.0 for layer in data["weights"] for row in layer for w in row[q + 1 :])
    assert data["provenance"]["causal"] is True and data["provenance"]["num_kv_heads"] == 2
    h0 = next(line for line in out.splitlines() if line.strip().startswith("h0 (kv0)"))
    assert h0.rstrip().endswith("-")  # the last tokens come after "it": masked


def test_piped_output_ends_no_line_in_padding_spaces(shared_model: None) -> None:
    """rich pads every table cell, the last too: 27 of 36 lines of `show ... --layer 3 |
    cat` ended in spaces. Plain output ends no line in a space; coloured output is the
    same text (colour cells keep their spaces: they end in an escape code)."""
    import re

    commands = [
        ["show", EXAMPLE, "--token", "it", "--layer", "3"],
        ["compare", EXAMPLE, "--token", "it", "--layer", "3"],
        ["heads", "--probe", "induction", "--probe-texts", "2"],
        ["explain", EXAMPLE, "--token", "it", "--layer", "3", "--head", "1"],
    ]
    for args in commands:
        out = run(*args, COLUMNS="80").stdout
        assert out.count("\n") > 5, args
        padded = [line for line in out.splitlines() if line != line.rstrip(" ")]
        assert padded == [], (args, padded[:3])
    coloured = runner.invoke(app, commands[0], env={"FORCE_COLOR": "1", "NO_COLOR": None, "COLUMNS": "200"}).stdout
    assert re.search(r"\x1b\[[0-9;]*48;2;", coloured)  # the heatmap's cells
    visible = re.sub(r"\x1b\[[0-9;]*m", "", coloured).splitlines()
    rows = [line for line in visible if re.match(r" *h\d+ ", line)]
    assert len(rows) == 12 and len({len(line) for line in rows}) == 1  # every head's row drawn to its last cell
    assert len(rows[0]) >= max(len(line) for line in run(*commands[0]).stdout.splitlines()[3:15])


def test_the_norm_measure_explains_itself_once(shared_model: None) -> None:
    out = run("show", EXAMPLE, "--token", "it", "--layer", "3", "--measure", "norm").stdout
    header = " ".join(out.split("layer 3 ·")[0].split())
    assert header.count("Kobayashi et al. 2020") == 1, header
    assert "‖α·f(x)‖" in header and "shares" in header
