"""Loading an engine: the device picked, the model resolved, its files checked before
anything is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import DeviceError, Reason, UnsupportedArchitectureError, UsageError
from ..io.checkpoint import require_tokenizer, validate_checkpoint
from ..io.models import ModelFiles, resolve

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

    from .base import Engine

ENGINES = ("own", "hf")
DTYPES = ("float32", "bfloat16", "float16")


def pick_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA, then Apple's MPS, then the CPU; an explicit device must exist.

    Raises:
        DeviceError: the device is not on this machine.
        UsageError: the name is not a device.
    """
    import torch

    name = name.strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceError(
            f"unknown device {name!r} (known: auto, cpu, cuda, cuda:N, mps)", reason=Reason.UNKNOWN
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("CUDA is not available on this machine", reason=Reason.ABSENT)
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceError(f"there is no {name}: this machine has {count} CUDA device(s)", reason=Reason.ABSENT)
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError("Apple MPS is not available on this machine", reason=Reason.ABSENT)
    elif device.type != "cpu":
        raise DeviceError(f"unsupported device {name!r} (known: auto, cpu, cuda, cuda:N, mps)", reason=Reason.UNKNOWN)
    return device


def load_engine(
    name: str = "own",
    model: str | ModelFiles | None = None,
    device: str = "auto",
    dtype: str = "float32",
    *,
    tokenizer: Tokenizer | None = None,
) -> Engine:
    """Resolve the model and build the engine on the device. ``tokenizer``: the
    checkpoint's own, already loaded (``tokens.load_tokenizer``) by a check before the
    model (explain's), so that it is not read twice.

    Raises:
        UsageError: unknown engine or dtype; DeviceError, ModelNotFoundError, ModelLoadError,
        UnsupportedArchitectureError as their names say.
    """
    import torch

    if name not in ENGINES:
        raise UsageError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})", reason=Reason.ENGINE)
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})", reason=Reason.DTYPE)
    torch_dtype = getattr(torch, dtype)
    dev = pick_device(device)
    files = model if isinstance(model, ModelFiles) else resolve(model)
    from .support import refusal

    if name == "own":  # an architecture we have not written: say so before judging its files
        from ..architectures import family

        try:
            family(files.config)
        except UnsupportedArchitectureError as exc:
            why = refusal(files.model_type)  # imports transformers, on this path alone
            if why is not None:
                raise UnsupportedArchitectureError(why, model_type=files.model_type, engine="none") from exc
            raise
    else:
        why = refusal(files.model_type)
        if why is not None:  # audio, images, block-sparse attention: before any model work
            raise UnsupportedArchitectureError(why, model_type=files.model_type, engine="none")
    # Config, weight headers and tokenizer agree, or nothing is built.
    validate_checkpoint(files.path, files.config)
    require_tokenizer(files.path)
    from .hf import HFEngine
    from .own import OwnEngine

    kind = OwnEngine if name == "own" else HFEngine
    engine: Engine = kind(files, dev, torch_dtype, tokenizer=tokenizer)
    return engine
