"""Our own transformer stacks, one module per family, all built on ``attnviz.nn.attention``.

A family module provides:
    MODEL_TYPES  config.json ``model_type`` values it reads
    PREFIXES     checkpoint name prefixes to strip ("bert.", "model.", ...)
    RULES        (regex, replacement) pairs from checkpoint names to our module names
    build(config: dict) -> AttnModel
    convert(tensors: dict, config: dict) -> dict   (optional: transposes, splits, ties)

torch + safetensors only: nothing here imports transformers.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import UnsupportedArchitectureError
from ..io.models import read_config, read_weights
from .base import AttnModel, ForwardOutput, load_into, rename

__all__ = ["AttnModel", "ForwardOutput", "build_from", "load", "registry", "supported_model_types"]

# Modules of this package that are not families.
_NOT_FAMILIES = frozenset({"base", "decoder", "seq2seq"})


@functools.cache
def registry() -> dict[str, ModuleType]:
    """model_type -> family module, built from each family module's own ``MODEL_TYPES``.

    A new family is one new module here; nothing else needs to list it. (Importing every
    family costs ~10 ms once torch is loaded, which the own engine needs anyway.)
    """
    out: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in _NOT_FAMILIES or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for model_type in getattr(module, "MODEL_TYPES", ()):
            if model_type in out:
                raise RuntimeError(
                    f"model_type {model_type!r} is declared twice: {out[model_type].__name__}, {info.name}"
                )
            out[model_type] = module
    return out


def supported_model_types() -> list[str]:
    return sorted(registry())


def family(config: dict[str, Any]) -> ModuleType:
    model_type = config.get("model_type")
    found = registry().get(model_type) if isinstance(model_type, str) else None
    if found is None:
        raise UnsupportedArchitectureError(
            f"the own engine does not implement model_type {model_type!r} "
            f"(it implements: {', '.join(supported_model_types())})",
            model_type=str(model_type),
        )
    if hasattr(found, "inner"):  # a vision-language wrapper (wrapped.py): its language model's family too
        found.inner(config)
    return found


def load(model_dir: Path, config: dict[str, Any] | None = None, device: Any = "cpu", dtype: Any = None) -> AttnModel:
    """Build the family's model for ``model_dir`` and fill it with the checkpoint's weights.

    The model is built on the meta device and takes the checkpoint tensors as they
    are, so nothing is randomly initialised only to be overwritten.
    """
    config = read_config(model_dir) if config is None else config
    family(config)  # an architecture we have not written: before reading any weight
    return build_from(config, read_weights(model_dir), model_dir, device, dtype)


def build_from(
    config: dict[str, Any], tensors: dict[str, Any], where: Path, device: Any = "cpu", dtype: Any = None
) -> AttnModel:
    """The family's model for ``config``, holding ``tensors`` (checkpoint names: a weight
    file's, or a transformers module's ``state_dict()``) as they are: no copy unless a
    family's ``convert`` must transpose or split, or ``device``/``dtype`` differ from the
    tensors'. ``where`` names the model in messages."""
    import torch

    module = family(config)
    with torch.device("meta"), _skip_init():
        try:
            model: AttnModel = module.build(config)
        except (TypeError, ValueError, KeyError, ArithmeticError) as exc:
            # ArithmeticError: a divisor of 0 or a size too large that no check above caught.
            from ..errors import ModelLoadError

            reason = f"lacks {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ModelLoadError(f"{where}/config.json: {reason}", hint="the config is invalid") from exc
    tensors = rename(tensors, module.RULES, module.PREFIXES)
    from ..io.checkpoint import check_tensors

    if torch.device(device).type != "cpu":
        # On the device before the check: there it is one reduction per tensor at the
        # device's bandwidth (a 16 GB checkpoint on one CPU core: seconds); the stored
        # dtype kept until the check has judged the values as stored.
        tensors = {name: tensor.to(device) for name, tensor in tensors.items()}
    check_tensors(tensors.items(), str(where))  # integer or non-finite weights: before any use
    if hasattr(module, "convert"):
        try:
            tensors = module.convert(tensors, config)
        except (RuntimeError, ValueError) as exc:  # a fused tensor the config's sizes do not split
            from ..errors import ModelLoadError

            raise ModelLoadError(
                f"{where}: the weights do not split as config.json says ({str(exc).splitlines()[0][:120]})",
                hint="config.json and the weights disagree: the checkpoint is corrupt or mixed up",
            ) from None
    load_into(model, tensors, where)
    return model.to(device=device, dtype=dtype or torch.float32).eval()


@contextlib.contextmanager
def _skip_init() -> Iterator[None]:
    """No random initialisation while building: every parameter is about to be replaced
    by the checkpoint's. (On the meta device the init calls would still cost: they pull
    in torch._dynamo, most of a second of start-up.)"""
    from torch.nn import init

    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_") and callable(getattr(init, n))]
    saved = {n: getattr(init, n) for n in names}
    try:
        for n in names:
            setattr(init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, fn in saved.items():
            setattr(init, n, fn)
