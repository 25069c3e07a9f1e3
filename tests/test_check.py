"""attnviz check: the comparison in the library, its table, and the typer command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from attnviz.architectures import bert, roberta
from attnviz.cli import app
from attnviz.errors import UsageError
from attnviz.measures.check import DEFAULT_SENTENCES, TOLERANCE, CheckResult, compare_engines
from attnviz.render.terminal.check import render_check, verdict

from .builders import SPECS_BY_NAME, save_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("check")
    return {name: save_tiny(SPECS_BY_NAME[name], root / name) for name in ("qwen2", "roberta")}


def _text(result: CheckResult) -> str:
    console = Console(record=True, width=100)
    console.print(render_check(result))
    return console.export_text()


def test_compare_engines_on_a_tiny_grouped_query_decoder(tiny: dict[str, Path]) -> None:
    result = compare_engines(str(tiny["qwen2"]), device="cpu")
    assert result.passed and result.model_type == "qwen2"
    assert len(result.attention) == result.shape.num_layers == 2
    assert (result.shape.num_heads, result.shape.num_kv_heads, result.shape.causal) == (4, 2, True)
    assert result.worst <= TOLERANCE
    text = _text(result)
    assert "PASS" in text and "hidden ok" in text
    assert "causal" in text and "4 query heads share 2 key/value heads" in text


def test_compare_engines_on_the_packaged_default_model() -> None:
    result = compare_engines(None, device="cpu")
    assert result.model_type == "bert" and result.shape.num_layers == 6
    assert result.passed, result.attention
    assert result.sentences == DEFAULT_SENTENCES


def test_a_wrong_implementation_fails_the_check(tiny: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # Forget RoBERTa's position offset: the weights must then disagree with transformers.
    monkeypatch.setattr(roberta.RobertaEmbeddings, "position_ids", bert.Embeddings.position_ids)
    result = compare_engines(str(tiny["roberta"]), device="cpu")
    assert not result.passed
    assert result.failed_layers == (0, 1) and result.hidden > TOLERANCE
    assert verdict(result).startswith("FAIL: layer 0, layer 1, hidden states over 1e-05")
    assert "attention OVER" in _text(result)


def test_check_needs_a_sentence(tiny: dict[str, Path]) -> None:
    with pytest.raises(UsageError):
        compare_engines(str(tiny["qwen2"]), sentences=["  "], device="cpu")


def test_cli_check_table_and_exit_status(tiny: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["check", "--model", str(tiny["qwen2"]), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "PASS: all 2 layers within 1e-05" in result.stdout
    assert "attention ok" in result.stdout


def test_cli_check_json_with_extra_sentences(tiny: dict[str, Path]) -> None:
    args = [
        "check",
        "--model",
        str(tiny["roberta"]),
        "--device",
        "cpu",
        "--json",
        "-s",
        "One more.",
        "-s",
        "And another.",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] is True and data["model_type"] == "roberta"
    assert data["sentences"][-2:] == ["One more.", "And another."]
    assert len(data["attention"]) == 2 and data["worst"] <= TOLERANCE


def test_cli_check_exits_1_when_weights_differ(tiny: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(roberta.RobertaEmbeddings, "position_ids", bert.Embeddings.position_ids)
    result = CliRunner().invoke(app, ["check", "--model", str(tiny["roberta"]), "--device", "cpu", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["passed"] is False


def test_cli_check_on_an_unsupported_model_raises_our_error(tmp_path: Path) -> None:
    from transformers import XLNetConfig

    from .builders import build_tokenizer

    XLNetConfig(vocab_size=101, d_model=48, n_layer=1, n_head=2).save_pretrained(tmp_path)  # no own stack for XLNet
    build_tokenizer("roberta").save_pretrained(tmp_path)
    result = CliRunner().invoke(app, ["check", "--model", str(tmp_path), "--device", "cpu"])
    # cli.py's handler turns our error into one stderr line and exit code 2.
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("attnviz: error: ")
    assert "'xlnet'" in line and "--engine hf" in line
