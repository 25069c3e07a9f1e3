"""Shareable outputs (the HTML page, notebook output, JSON provenance) name the model by
what the user typed when it names no place on this machine, else by the checkpoint
directory's own name, never an absolute local path; ``--provenance full`` keeps the path,
``--model-name`` (or ATTNVIZ_MODEL_NAME, or the config key model_name) sets the name."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from attnviz.io.models import shareable_name

from .helpers import save_tiny_bert


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("home") / "someuser" / "models" / "my-bert")


def run(*args: str, **env: str) -> Any:
    clean = {"ATTNVIZ_MODEL_NAME": None, "ATTNVIZ_PROVENANCE": None, "NO_COLOR": "1"}
    return CliRunner().invoke(app, list(args), env={**clean, **env})


def test_shareable_name_rules() -> None:
    assert shareable_name("bert-base-uncased") == "bert-base-uncased"
    assert shareable_name("org/name") == "org/name"
    assert shareable_name("all-MiniLM-L6-v2") == "all-MiniLM-L6-v2"
    assert shareable_name("models/x") == "models/x"  # relative, below the working directory
    assert shareable_name("/home/u/models/x") == "x"
    assert shareable_name("/home/u/models/x/") == "x"
    assert shareable_name("~/models/x") == "x"
    assert shareable_name("../../u/models/x") == "x"
    assert shareable_name("BertModel in memory (/home/u/models/x)") == "BertModel in memory (x)"


def test_the_page_carries_no_absolute_path(deep_model: Path, tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    done = run("export", "the cat sat", "--model", str(deep_model), "-o", str(page))
    assert done.exit_code == 0, done.output
    text = page.read_text(encoding="utf-8")
    assert str(deep_model) not in text and "someuser" not in text and str(tmp_path) not in text
    assert '"model":"my-bert"' in text.replace(" ", "")


def test_json_provenance_carries_no_absolute_path_unless_full(deep_model: Path) -> None:
    args = ("show", "the cat sat", "--token", "cat", "--model", str(deep_model), "--json")
    short = run(*args)
    assert short.exit_code == 0, short.output
    assert "someuser" not in short.stdout
    doc = json.loads(short.stdout)
    assert doc["model"] == "my-bert" and doc["provenance"]["model_path"] == "my-bert"
    full = json.loads(run("--provenance", "full", *args).stdout)
    assert full["provenance"]["model_path"] == str(deep_model.resolve())
    named = json.loads(run("--model-name", "Our BERT", *args).stdout)
    assert named["model"] == "Our BERT" and "someuser" not in json.dumps(named)
    again = json.loads(run(*args).stdout)  # the name does not stick to the next call
    assert again["model"] == "my-bert"


def test_model_name_from_the_config_file(deep_model: Path, tmp_path: Path) -> None:
    (tmp_path / "attnviz").mkdir()
    (tmp_path / "attnviz" / "config.toml").write_text('model_name = "lab-bert"\n', encoding="utf-8")
    done = run(
        "show", "the cat sat", "--token", "cat", "--model", str(deep_model), "--json", XDG_CONFIG_HOME=str(tmp_path)
    )
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["model"] == "lab-bert"


def test_notebook_output_carries_no_absolute_path(deep_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNVIZ_MODEL_NAME", raising=False)
    monkeypatch.delenv("ATTNVIZ_PROVENANCE", raising=False)
    att = attnviz.inspect("the cat sat", model=str(deep_model), device="cpu")
    assert "someuser" not in att._repr_html_() and "someuser" not in repr(att.show())
    assert "someuser" not in att.to_json(1)
    from transformers import AutoModel, AutoTokenizer

    mem = attnviz.inspect(
        "the cat sat",
        model=AutoModel.from_pretrained(str(deep_model)),
        tokenizer=AutoTokenizer.from_pretrained(str(deep_model)),
        device="cpu",
    )
    assert mem.provenance.model == "BertModel in memory (my-bert)"
    assert "someuser" not in mem._repr_html_() and "someuser" not in os.fspath(mem.provenance.model_path)
