"""Checkpoint validation before anything is allocated.

A checkpoint is three things that must agree: config.json, the weight files and the
tokenizer. Everything here runs on what can be read cheaply (the JSON config, the
safetensors headers: 8 bytes of length and a JSON table of names, dtypes and shapes)
before a model is built, so a lying config costs milliseconds, not minutes and
gigabytes:

    validate_config(config, where)     types and ranges of the size fields, by name
    validate_checkpoint(dir, config)   config vs weight headers: the model's size
                                       estimated from the config, the layer count,
                                       integer weights
    check_tensors(named)               after loading: integer or non-finite weights,
                                       naming the first layer where they appear
    first_nonfinite_layer(weights)     the same for attention rows
    tokenizer_files(dir)               which tokenizer files exist (none: refuse)

Stdlib only at import time (``check_tensors`` takes tensors from the caller and uses
their own methods). Errors are ``ModelLoadError`` (exit 2: the input is bad).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError

# --- config fields -------------------------------------------------------------------

# Size fields of transformers configs, by family spelling. Checked when present and not
# null: a whole number in [low, 2**31).
_POSITIVE_INTS = (
    "num_hidden_layers", "n_layer", "n_layers", "num_layers",
    "hidden_size", "n_embd", "dim", "d_model",
    "num_attention_heads", "n_head", "n_heads", "num_heads",
    "num_key_value_heads", "head_dim",
    "intermediate_size", "n_inner", "hidden_dim", "d_ff", "ffn_dim",
    "vocab_size", "max_position_embeddings", "n_positions",
    "embedding_size", "num_hidden_groups", "inner_group_num", "sliding_window",
)  # fmt: skip
# Fields that may be 0 where they are switched off: transformers 5 saves Qwen2-MoE configs
# with "sliding_window": 0 whenever use_sliding_window is false (the value is then unused).
_OFF_WHEN_ZERO = {"sliding_window": "use_sliding_window"}
_NONNEGATIVE_INTS = ("type_vocab_size", "max_window_layers")
_POSITIVE_FLOATS = ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "rope_theta")
_INT_LIMIT = 2**31
# Sizes a family may give per layer, as a list of whole numbers (Gemma 3n's intermediate_size).
_PER_LAYER_INTS = ("intermediate_size",)

LAYER_FIELDS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_HIDDEN_FIELDS = ("hidden_size", "n_embd", "dim", "d_model")
_INTERMEDIATE_FIELDS = ("intermediate_size", "n_inner", "hidden_dim", "d_ff", "ffn_dim")


def _first(config: Mapping[str, Any], names: Sequence[str]) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return None


def validate_config(config: Mapping[str, Any], where: str = "config.json") -> None:
    """Check the type and range of every size field present in ``config``.

    Raises:
        ModelLoadError: a field is not a whole number where one belongs (a string, a
            bool, 12.5), is zero or negative, or is absurdly large; the message names it.
    """
    hint = "config.json is corrupt or hand-edited wrongly; re-save the checkpoint"
    for name in _POSITIVE_INTS + _NONNEGATIVE_INTS:
        value = config.get(name)
        if value is None:
            continue
        low = 1 if name in _POSITIVE_INTS else 0
        switch = _OFF_WHEN_ZERO.get(name)
        if switch is not None and value == 0 and config.get(switch) is False:
            continue
        if name in _PER_LAYER_INTS and isinstance(value, list):
            _check_per_layer(config, name, value, where, hint)
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelLoadError(f"{where}: {name} must be a whole number, not {_shown(value)}", hint=hint)
        if not low <= value < _INT_LIMIT:
            bound = "at least 1" if low else "0 or more"
            if value >= _INT_LIMIT:
                bound = f"below {_INT_LIMIT}"
            raise ModelLoadError(f"{where}: {name} is {value}; it must be {bound}", hint=hint)
    for name in _POSITIVE_FLOATS:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelLoadError(f"{where}: {name} must be a number, not {_shown(value)}", hint=hint)
        if not math.isfinite(value) or value <= 0:
            raise ModelLoadError(f"{where}: {name} is {value}; it must be a positive number", hint=hint)
    hidden, heads = _first(config, _HIDDEN_FIELDS), _first(config, ("num_attention_heads", "n_head", "n_heads"))
    kv = config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise ModelLoadError(
            f"{where}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}", hint=hint
        )
    own_head_dim = config.get("head_dim") is not None or config.get("d_kv") is not None
    if isinstance(hidden, int) and isinstance(heads, int) and not own_head_dim and hidden % heads:
        raise ModelLoadError(f"{where}: the width {hidden} is not divisible by the {heads} attention heads", hint=hint)


def _check_per_layer(config: Mapping[str, Any], name: str, values: list[Any], where: str, hint: str) -> None:
    """A size given per layer (Gemma 3n's ``intermediate_size``): one whole number in
    [1, 2**31) for each of the ``num_hidden_layers`` layers."""
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and len(values) != layers:
        raise ModelLoadError(f"{where}: {name} lists {len(values)} sizes for {layers} layers", hint=hint)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < _INT_LIMIT:
            raise ModelLoadError(
                f"{where}: {name} must be whole numbers from 1 to {_INT_LIMIT - 1}, one per layer; "
                f"it holds {_shown(value)}",
                hint=hint,
            )


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}"


def check_regular_file(path: Path, max_bytes: int | None = None) -> None:
    """``path`` is a regular file (not a FIFO, a device such as /dev/zero, a directory)
    of at most ``max_bytes``: reading it will end, and fit in memory.

    Raises:
        ModelLoadError: it is not, naming the file.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ModelLoadError(f"{path} is missing", hint="re-download or re-save the checkpoint") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {_reason(exc)}", hint="check the permissions") from None
    import stat

    if not stat.S_ISREG(info.st_mode):
        raise ModelLoadError(f"{path} is not a regular file", hint="a checkpoint holds plain files")
    if max_bytes is not None and info.st_size > max_bytes:
        raise ModelLoadError(
            f"{path} is {info.st_size:,} bytes; more than {max_bytes:,} is not plausible for this file",
            hint="the file is not what its name says; re-save the checkpoint",
        )


MAX_CONFIG_BYTES = 16 * 2**20
# The largest real tokenizer.json files are ~35 MB (Gemma 3's 262k-piece vocabulary);
# a 1 GiB one was read whole and parsed (2.3 GB) before its refusal. 256 MiB is 7x that.
MAX_TOKENIZER_BYTES = 256 * 2**20


# --- weight files and their headers --------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a weight file's header describes it."""

    name: str
    dtype: str  # safetensors spelling: F32, F16, BF16, I8, ...
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


_INTEGER_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"}
_HEADER_LIMIT = 100 * 2**20  # the largest real headers (hundreds of shards' worth) are a few MB


def weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's weight files, safetensors first (single or sharded), else PyTorch .bin.

    Raises:
        ModelLoadError: no weights, or an unreadable shard index.
    """
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (model_dir / single).is_file():
            return [model_dir / single]
        if (model_dir / index).is_file():
            names = sorted(set(shard_map(model_dir / index).values()))
            if not names or any("/" in n or n.startswith(".") for n in names):
                raise ModelLoadError(f"{model_dir / index} names no usable shards", hint="the shard index is corrupt")
            return [model_dir / name for name in names]
    raise ModelLoadError(
        f"{model_dir} has no weights (model.safetensors or pytorch_model.bin)",
        hint="save the model with model.save_pretrained(DIR)",
    )


def shard_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` of a shard index: tensor name -> shard file name.

    Raises:
        ModelLoadError: unreadable, not bounded JSON, or not a map of strings to strings.
    """
    hint = "the shard index is corrupt"
    check_regular_file(index, MAX_CONFIG_BYTES)
    try:
        raw = index.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read {index}: {_reason(exc)}", hint=hint) from None
    table = read_json(raw, str(index), hint)
    mapping = table.get("weight_map") if isinstance(table, dict) else None
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise ModelLoadError(f"{index}: weight_map is not a map of tensor names to shard files", hint=hint)
    return dict(mapping)


def read_json(raw: str | bytes, where: str, hint: str, max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """``raw`` through the one bounded JSON reader, a refusal as a ModelLoadError."""
    from .jsonread import JSONInputError, loads

    try:
        return loads(raw, where, max_bytes=max_bytes, hint=hint)
    except JSONInputError as exc:
        raise ModelLoadError(exc.message, hint=hint) from None


def check_shards(model_dir: Path, files: Sequence[Path], names: Sequence[Sequence[str]]) -> None:
    """The tensors each shard holds (``names[i]`` for ``files[i]``) against the index.

    Loading shards one after another keeps the last copy of a name held twice, and a
    tensor the index maps elsewhere (or not at all) is read from wherever it lies: both
    give silently different weights than the checkpoint describes (transformers reads
    the same files, so ``check`` cannot see it). Refused instead.

    Raises:
        ModelLoadError: a name in two shards, a tensor the index maps to another shard
            or does not name, or a tensor the index names that its shard lacks.
    """
    hint = "the shards and their index disagree; re-save the checkpoint with save_pretrained"
    single = files[0].name in ("model.safetensors", "pytorch_model.bin")
    index = model_dir / (
        "model.safetensors.index.json" if files[0].suffix == ".safetensors" else "pytorch_model.bin.index.json"
    )
    mapping = None if single else shard_map(index)
    seen: dict[str, str] = {}
    for path, held in zip(files, names, strict=True):
        for name in held:
            if name in seen:
                raise ModelLoadError(
                    f"{model_dir}: tensor {name!r} is in two shards, {seen[name]} and {path.name}", hint=hint
                )
            seen[name] = path.name
            if mapping is not None and mapping.get(name) != path.name:
                told = f"maps it to {mapping[name]}" if name in mapping else "does not name it"
                raise ModelLoadError(f"{model_dir}: {path.name} holds {name!r}, but {index.name} {told}", hint=hint)
    if mapping is not None:
        lost = sorted(set(mapping) - set(seen))
        if lost:
            raise ModelLoadError(
                f"{model_dir}: {index.name} maps {lost[0]!r} to {mapping[lost[0]]}, which does not hold it"
                + (f" (nor {len(lost) - 1} more)" if len(lost) > 1 else ""),
                hint=hint,
            )


def read_safetensors_header(path: Path) -> list[TensorInfo]:
    """The tensors a .safetensors file holds, from its header alone (no tensor is read).

    Raises:
        ModelLoadError: the file is missing, truncated, or its header is not a safetensors header.
    """
    bad = "the file is corrupt or truncated; re-download or re-save the checkpoint"
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{path} is too short to be a safetensors file", hint=bad)
            (length,) = struct.unpack("<Q", head)
            if length > _HEADER_LIMIT:
                raise ModelLoadError(f"{path}: a safetensors header of {length} bytes is not plausible", hint=bad)
            raw = fh.read(length)
            fh.seek(0, 2)
            size = fh.tell()
    except FileNotFoundError:
        raise ModelLoadError(f"weight file {path} is missing", hint="re-download the checkpoint") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {_reason(exc)}", hint=bad) from None
    if len(raw) < length:
        raise ModelLoadError(f"{path} is truncated inside its header", hint=bad)
    table = read_json(raw, f"{path}: the safetensors header", bad, max_bytes=_HEADER_LIMIT)
    if not isinstance(table, dict):
        raise ModelLoadError(f"{path}: the safetensors header is not a JSON object", hint=bad)
    out: list[TensorInfo] = []
    data_size = size - 8 - length
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = str(entry["dtype"]), tuple(entry["shape"]), entry["data_offsets"]
            ok = all(isinstance(d, int) and d >= 0 for d in shape) and 0 <= start <= end <= data_size
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise ModelLoadError(f"{path}: the header entry for {name!r} is malformed or points past the end", hint=bad)
        out.append(TensorInfo(name, dtype, shape))
    return out


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else type(exc).__name__


# --- layers in tensor names ----------------------------------------------------------

# A layer stack is a name segment like these followed by the layer number:
# bert.encoder.layer.3., model.layers.3., transformer.h.3., distilbert.transformer.layer.3.
_STACK = re.compile(r"(?:^|\.)((?:layer|layers|h|block|blocks))\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """The layer number in a tensor name (``encoder.layer.3.attention...`` -> 3), if any."""
    m = _STACK.search(name)
    return int(m[2]) if m else None


def _stacks(names: Iterable[str]) -> dict[str, set[int]]:
    """Layer numbers per stack prefix (``bert.encoder.layer`` -> {0, 1, ...})."""
    out: dict[str, set[int]] = {}
    for name in names:
        m = _STACK.search(name)
        if m:
            out.setdefault(name[: m.start(2) - 1], set()).add(int(m[2]))
    return out


def config_layers(config: Mapping[str, Any]) -> int | None:
    value = _first(config, LAYER_FIELDS)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def estimate_min_params(config: Mapping[str, Any]) -> int | None:
    """A lower bound of the parameter count config.json implies (None: too little to tell).

    Per layer at least E·E (the query projection) + E·I (one MLP matrix), and the token
    embeddings V·min(E, embedding_size). Every real family has more than this (keys,
    values, the output projection, the second MLP matrix), so a checkpoint whose weights
    hold fewer elements than this bound cannot be the model its config describes.
    ALBERT shares one block across layers: there the blocks are groups × inner_group_num.
    """
    layers = config_layers(config)
    hidden = _first(config, _HIDDEN_FIELDS)
    if not isinstance(layers, int) or not isinstance(hidden, int):
        return None
    inner = _first(config, _INTERMEDIATE_FIELDS)
    if isinstance(inner, list) and inner and all(isinstance(v, int) for v in inner):
        inner = min(inner)  # per layer (Gemma 3n): the smallest bounds every layer from below
    inner = inner if isinstance(inner, int) else hidden
    if config.get("model_type") == "albert":
        groups, per_group = config.get("num_hidden_groups", 1), config.get("inner_group_num", 1)
        if isinstance(groups, int) and isinstance(per_group, int):  # validate_config refuses 0
            layers = min(layers, groups * per_group)
    vocab = config.get("vocab_size")
    embed = config.get("embedding_size")
    width = min(hidden, embed) if isinstance(embed, int) else hidden
    return layers * (hidden * hidden + hidden * inner) + (vocab * width if isinstance(vocab, int) else 0)


def validate_checkpoint(model_dir: Path, config: Mapping[str, Any]) -> list[TensorInfo] | None:
    """Config against the weight files' headers, before any model is built.

    Checks (safetensors; a .bin checkpoint has no header to read without unpickling,
    so only its total size bounds the config):
        * the parameter count the config implies fits in the weights;
        * the layer numbers in the tensor names are exactly 0..num_hidden_layers-1 (no
          missing layer, no unused one), when the names show one layer stack;
        * no ``*.weight`` tensor is stored as integers (quantized checkpoints).

    Returns the header entries (None for .bin). Raises ModelLoadError.
    """
    validate_config(config, f"{model_dir}/config.json")
    files = weight_files(model_dir)
    where = f"{model_dir}"
    if files[0].suffix != ".safetensors":
        total = 0
        for path in files:
            try:
                total += path.stat().st_size
            except OSError:
                raise ModelLoadError(f"weight file {path} is missing", hint="re-download the checkpoint") from None
        need = estimate_min_params(config)
        if need is not None and need > total:  # every element takes at least one byte
            raise _too_big(where, config, need, f"{total} bytes of weights")
        return None
    for path in files:
        check_regular_file(path)
    headers = [read_safetensors_header(path) for path in files]
    check_shards(model_dir, files, [[i.name for i in h] for h in headers])
    infos = [info for header in headers for info in header]
    for info in infos:
        if info.dtype.upper() in _INTEGER_DTYPES and info.name.endswith(_PARAMETERS):
            raise ModelLoadError(
                f"{where}: {_kind(info.name)} {info.name} is stored as {info.dtype} integers",
                hint="quantized or integer checkpoints are not supported; use a float16/bfloat16/float32 checkpoint",
            )
    need = estimate_min_params(config)
    have = sum(i.numel for i in infos)
    if need is not None and need > have:
        raise _too_big(where, config, need, f"{have:,} parameters in the weights")
    layers = config_layers(config)
    stacks = _stacks(i.name for i in infos)
    if layers is not None and len(stacks) == 1:
        ((prefix, found),) = stacks.items()
        field = next(n for n in LAYER_FIELDS if config.get(n) is not None)
        missing = sorted(set(range(layers)) - found)
        extra = sorted(n for n in found if n >= layers)
        if missing:
            raise ModelLoadError(
                f"{where}: config.json says {field}={layers}, but the weights have no {prefix}.{missing[0]}"
                + (f" (nor {len(missing) - 1} more layers)" if len(missing) > 1 else ""),
                hint="the checkpoint is incomplete, or config.json belongs to another model",
            )
        if extra:
            raise ModelLoadError(
                f"{where}: config.json says {field}={layers}, but the weights also hold {prefix}.{extra[0]}"
                + (f" to {prefix}.{extra[-1]}" if len(extra) > 1 else "")
                + ", which would go unused",
                hint="config.json and the weights disagree: fix num_hidden_layers or re-save the checkpoint",
            )
    return infos


# Learned parameters end so; integer buffers (position_ids) may be stored as integers.
_PARAMETERS = ("weight", "bias")


def _kind(name: str) -> str:
    return "bias" if name.endswith("bias") else "weight"


def _too_big(where: str, config: Mapping[str, Any], need: int, have: str) -> ModelLoadError:
    fields = ", ".join(
        f"{n}={config[n]}"
        for n in (*LAYER_FIELDS, *_HIDDEN_FIELDS, *_INTERMEDIATE_FIELDS, "vocab_size")
        if isinstance(config.get(n), int)
    )
    return ModelLoadError(
        f"{where}: config.json ({fields}) describes at least {need:,} parameters, but there are only {have}",
        hint="config.json and the weights disagree: the config is wrong or the weights are incomplete",
    )


# --- loaded tensors ------------------------------------------------------------------


def check_tensors(named: Iterable[tuple[str, Any]], where: str) -> None:
    """Refuse integer weights and weights holding NaN or ±Inf, naming the first layer.

    ``named`` yields (name, torch.Tensor). Embeddings and other tensors outside the
    layer stack count as coming before layer 0.

    Raises:
        ModelLoadError: the first offending tensor, by layer.
    """
    from ..nn.threads import ELEMENTS_PER_THREAD, limited

    tensors = list(named)
    worst: tuple[float, str, str] | None = None
    with limited(sum(t.numel() for _, t in tensors), ELEMENTS_PER_THREAD):
        bad = [(name, tensor) for name, tensor in tensors if not _all_finite(name, tensor, where)]
    for name, tensor in bad:
        layer = layer_of(name)
        rank = float(layer) if layer is not None else -1.0 if _EMBEDDING.search(name) else math.inf
        kind = "NaN" if bool(tensor.isnan().any()) else "infinite values"
        if worst is None or rank < worst[0]:
            worst = (rank, name, kind)
    if worst is not None:
        rank, name, kind = worst
        place = "the embeddings" if rank < 0 else f"layer {int(rank)}" if math.isfinite(rank) else name
        raise ModelLoadError(
            f"{where}: the weights hold {kind}, first in {place} ({name})",
            hint="the checkpoint is damaged (or was saved after training diverged); re-save or re-download it",
        )


def _all_finite(name: str, tensor: Any, where: str) -> bool:
    """No NaN or ±Inf in ``tensor`` (True for integer biases and meta tensors), on the
    tensor's own device.

    One min/max reduction: NaN propagates into both, ±Inf is an extreme. Measured on
    one CPU core, 50 M float32: 15 ms, against 490 ms for ``isfinite().all()``, which
    writes a bool per element first (a 16 GB checkpoint: ~1 s instead of 11-20 s).

    Raises:
        ModelLoadError: an integer ``*weight`` or ``*bias`` (a quantized checkpoint).
    """
    if not tensor.is_floating_point():
        if name.endswith(_PARAMETERS):
            raise ModelLoadError(
                f"{where}: {_kind(name)} {name} is stored as {str(tensor.dtype).removeprefix('torch.')}",
                hint="quantized or integer checkpoints are not supported; use a float checkpoint",
            )
        return True
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return True
    try:
        low, high = tensor.aminmax()
    except (RuntimeError, NotImplementedError):  # a device or dtype without aminmax
        return bool(tensor.isfinite().all())
    return bool(low.isfinite() & high.isfinite())


_EMBEDDING = re.compile(r"embed|(?:^|\.)(?:tokens|positions|token_types|wte|wpe)\.")


def first_nonfinite_layer(weights: Any, layers: Sequence[int]) -> int | None:
    """The first of ``layers`` whose attention rows ``weights`` (N, H, Q, S) hold NaN/Inf."""
    import numpy as np

    bad = ~np.isfinite(weights).reshape(len(layers), -1).all(axis=1)  # (N,)
    hits = np.flatnonzero(bad)
    return int(layers[int(hits[0])]) if hits.size else None


# --- tokenizer -----------------------------------------------------------------------

# What a checkpoint may ship a tokenizer as; transformers builds a fast tokenizer from any.
TOKENIZER_FILES = (
    ("tokenizer.json",),
    ("vocab.txt",),
    ("vocab.json", "merges.txt"),
    ("tokenizer.model",),
    ("spiece.model",),
    ("sentencepiece.bpe.model",),
)


def tokenizer_files(model_dir: Path) -> tuple[str, ...] | None:
    """The first complete set of tokenizer files in ``model_dir``, or None.

    Without one, transformers would invent a tokenizer with an empty vocabulary, which
    maps every word to [UNK] while the labels still show the words: refuse instead.
    """
    for names in TOKENIZER_FILES:
        if all((model_dir / n).exists() for n in names):
            for n in names:
                check_regular_file(model_dir / n, MAX_TOKENIZER_BYTES)
            return names
    return None


# The tokenizer's JSON files, which transformers and tokenizers parse with no bound of
# their own (a 100,000-deep tokenizer_config.json loaded with exit 0; issue 25's fuzz).
TOKENIZER_JSON = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
)


def require_tokenizer(model_dir: Path) -> tuple[str, ...]:
    """``tokenizer_files``, refusing none; every tokenizer JSON file present is read
    through the bounded reader first (depth, numbers, NaN, UTF-8).

    Raises:
        ModelLoadError: no tokenizer, or a tokenizer JSON file the bounded reader refuses.
    """
    found = tokenizer_files(model_dir)
    if found is None:
        looked = ", ".join(" + ".join(names) for names in TOKENIZER_FILES)
        raise ModelLoadError(
            f"{model_dir} has no tokenizer (looked for {looked})",
            hint="save one beside the weights with tokenizer.save_pretrained(DIR)",
        )
    hint = "the tokenizer file is corrupt; re-save it with tokenizer.save_pretrained(DIR)"
    for name in TOKENIZER_JSON:
        path = model_dir / name
        if not path.exists():
            continue
        check_regular_file(path, MAX_TOKENIZER_BYTES)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ModelLoadError(f"cannot read {path}: {_reason(exc)}", hint=hint) from None
        if not isinstance(read_json(raw, str(path), hint, max_bytes=MAX_TOKENIZER_BYTES), dict):
            raise ModelLoadError(f"{path} is not a JSON object", hint=hint)
    return found
