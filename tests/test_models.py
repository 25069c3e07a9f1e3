"""Model specs: the packaged default, local directories, Hub ids (offline here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnviz.cli import hint_for
from attnviz.errors import ModelLoadError, ModelNotFoundError
from attnviz.io.models import DEFAULT_MODEL, resolve

from .helpers import save_tiny_bert


@pytest.mark.parametrize("spec", [None, "", "all-MiniLM-L6-v2", "minilm", "sentence-transformers/all-MiniLM-L6-v2"])
def test_default_model_is_packaged(spec: str | None, minilm_dir: Path) -> None:
    files = resolve(spec)
    assert files.path == minilm_dir
    assert files.model_type == "bert"
    assert (files.path / "model.safetensors").is_file()
    if spec in (None, ""):
        assert files.spec == DEFAULT_MODEL


def test_local_directory(tmp_path: Path) -> None:
    save_tiny_bert(tmp_path)
    files = resolve(str(tmp_path))
    assert files.path == tmp_path.resolve()
    assert files.config["hidden_size"] == 48


def test_a_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="is a file"):
        resolve(str(f))


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve(str(tmp_path))


def test_config_that_is_not_an_object(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="not a JSON object"):
        resolve(str(tmp_path))


def test_hub_id_offline_fails_with_a_hint() -> None:
    with pytest.raises(ModelNotFoundError) as info:
        resolve("nobody-xyz/not-a-model")
    assert "could not be downloaded" in info.value.message
    assert info.value.facts["reason"] == "offline"
    assert "--model DIR" in (hint_for(info.value) or "")


def test_hub_id_from_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hub id already in the Hugging Face cache loads offline from there."""
    import os

    cache = tmp_path / "hub"
    snapshot = cache / "models--org--tiny" / "snapshots" / ("0" * 40)
    save_tiny_bert(snapshot)
    (cache / "models--org--tiny" / "refs").mkdir(parents=True)
    (cache / "models--org--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # "org/tiny" must not exist as a relative path
    assert not os.path.exists("org/tiny")
    files = resolve("org/tiny")
    assert files.path == snapshot
