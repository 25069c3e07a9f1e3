"""Engines for a model already in memory: a transformers ``PreTrainedModel`` and its
tokenizer, as a notebook holds them after ``from_pretrained`` (no disk round trip).

    from_model(model, tokenizer, "own")   our stack built from the module's config and
                                          state_dict: the tensors are taken as they are
                                          (views of the module's weights, no copy unless a
                                          family must transpose, or another device/dtype
                                          is asked)
    from_model(model, tokenizer, "hf")    the module itself; ``engine.running()``
                                          switches it to eager attention and eval mode
                                          for a run and restores both afterwards

The same checks as the path loader run first (``checkpoint.validate_config`` on the
config, ``checkpoint.check_tensors`` on the weights), and what attnviz cannot read is
refused with one ``AttnvizError`` saying what is accepted. torch and transformers are
never imported here: the model brought them, and its objects are duck-typed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DeviceError, ModelLoadError, Reason, UnsupportedArchitectureError, UsageError
from ..io.checkpoint import validate_config
from ..io.models import ModelFiles

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from .base import Engine

ACCEPTED = (
    "a transformers PreTrainedModel (AutoModel.from_pretrained(...), float weights on one device) "
    "with its tokenizer, or a checkpoint directory or Hub id"
)


def _refuse(what: str, hint: str = ACCEPTED) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"attnviz cannot read {what}", hint=f"accepted: {hint}", reason=Reason.MODEL_OBJECT
    )


def check_model(model: Any) -> None:
    """Refuse what is not a transformers model attnviz can read, before anything runs.

    Raises:
        UnsupportedArchitectureError (facts: reason "model_object"): a TransformerLens
            HookedTransformer (its weights are reshaped and folded: not a transformers
            checkpoint), a quantized model, or any other object.
    """
    kind = type(model).__name__
    if kind == "HookedTransformer" or (hasattr(model, "run_with_cache") and hasattr(model, "cfg")):
        raise _refuse(
            f"a TransformerLens {kind}: its weights are folded and reshaped, not a transformers model's",
            ACCEPTED + " (load the same model with transformers' AutoModel)",
        )
    config = getattr(model, "config", None)
    if not (callable(getattr(model, "state_dict", None)) and callable(getattr(config, "to_dict", None))):
        raise _refuse(f"a {kind}: it is not a transformers model (no config and state_dict)")
    quantized = getattr(model, "is_quantized", False) or getattr(model, "hf_quantizer", None) is not None
    if quantized or getattr(config, "quantization_config", None):
        raise _refuse(
            f"a quantized {kind}: its weights are not the float weights attention is computed from",
            "a float16/bfloat16/float32 model (load it without a quantization_config)",
        )


def model_files(model: Any) -> ModelFiles:
    """The model's config as the path loader's ``ModelFiles`` (validated), named after its
    class and the checkpoint it came from. The path is that checkpoint's directory when
    it still exists (generation_config.json is read from it), else a placeholder."""
    config = model.config.to_dict()
    named = getattr(model.config, "_name_or_path", None)
    source = named if isinstance(named, str) else str(config.get("_name_or_path", ""))
    spec = f"{type(model).__name__} in memory" + (f" ({source})" if source else "")
    if not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise _refuse(f"a {type(model).__name__} whose config has no model_type")
    validate_config(config, f"{spec}: config")
    path = Path(source) if source and Path(source).is_dir() else Path(f"<{type(model).__name__} in memory>")
    return ModelFiles(spec=spec, path=path, config=config)


def backend_tokenizer(tokenizer: Any, files: ModelFiles) -> Tokenizer:
    """A copy of the tokenizers-library tokenizer behind ``tokenizer`` (a transformers
    fast tokenizer, or a ``tokenizers.Tokenizer``), padding and truncation off, checked
    against the model's vocabulary; the caller's object is left as it was.

    Raises:
        UsageError (facts: reason "tokenizer"): none given, not a fast tokenizer, or a
            vocabulary that does not fit the model's embeddings.
    """
    if tokenizer is None:
        raise UsageError(
            f"{files.spec} came without a tokenizer",
            hint="pass the model's own tokenizer: AutoTokenizer.from_pretrained(the same checkpoint)",
            reason=Reason.TOKENIZER,
        )
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not (callable(getattr(backend, "to_str", None)) and callable(getattr(backend, "encode", None))):
        raise UsageError(
            f"a {type(tokenizer).__name__} is not a fast (tokenizers) tokenizer",
            hint="pass AutoTokenizer.from_pretrained(..., use_fast=True)",
            reason=Reason.TOKENIZER,
        )
    from tokenizers import Tokenizer

    try:
        copy = Tokenizer.from_str(backend.to_str())
    except Exception as exc:  # a Python (custom) pre-tokenizer, normalizer or decoder: no JSON form
        raise UsageError(
            f"the {type(tokenizer).__name__} cannot be copied: {str(exc)[:120]}",
            hint="pass a tokenizer without custom Python components (AutoTokenizer.from_pretrained(...))",
            reason=Reason.TOKENIZER,
        ) from None
    copy.no_padding()
    copy.no_truncation()
    vocab = files.config.get("vocab_size")
    size = copy.get_vocab_size(with_added_tokens=True)
    if isinstance(vocab, int) and size > vocab:
        raise UsageError(
            f"the tokenizer has {size:,} tokens but {files.spec} embeds {vocab:,}: they do not belong together",
            hint="pass the tokenizer saved with this model (AutoTokenizer.from_pretrained of the same checkpoint)",
            reason=Reason.TOKENIZER,
            tokenizer_size=size,
            vocab_size=vocab,
        )
    return copy


def model_device(model: Any) -> Any:
    """The one device holding the model's weights.

    Raises:
        DeviceError: weights on the meta device (never loaded) or spread over several.
    """
    devices = {p.device for p in model.parameters()}
    if any(d.type == "meta" for d in devices):
        raise DeviceError(
            f"{type(model).__name__}'s weights are on the meta device: they were never loaded",
            hint="load the model with its weights (from_pretrained without device_map='meta')",
            reason=Reason.META,
        )
    if len(devices) != 1:
        shown = ", ".join(sorted(str(d) for d in devices)) or "none"
        raise DeviceError(
            f"{type(model).__name__}'s weights are on {len(devices)} devices ({shown})",
            hint="move the model to one device with model.to(DEVICE)",
            reason=Reason.DEVICES,
        )
    return devices.pop()


def from_model(model: Any, tokenizer: Any, name: str = "own", device: str = "auto", dtype: str | None = None) -> Engine:
    """An engine over ``model`` (a transformers PreTrainedModel) and its ``tokenizer``.

    ``device`` "auto" (default) runs where the model's weights are; another device must
    exist (``pick_device``): the own engine then holds a copy there, the hf engine refuses
    (it would move the caller's model). ``dtype`` None keeps the weights' dtype.

    Raises:
        UnsupportedArchitectureError: a model object attnviz cannot read (``check_model``),
            or a family the own engine has not written.
        UsageError: an unknown engine or dtype, a missing or mismatched tokenizer.
        DeviceError: the device asked is not on this machine, or the weights are not on
            one real device. ModelLoadError: a config or weights the checks refuse.
    """
    import torch

    from .hf import HFEngine
    from .load import DTYPES, ENGINES, pick_device
    from .own import OwnEngine

    if name not in ENGINES:
        raise UsageError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})", reason=Reason.ENGINE)
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})", reason=Reason.DTYPE)
    check_model(model)
    files = model_files(model)
    here = model_device(model)
    dev = here if device == "auto" else pick_device(device)
    floats = {p.dtype for p in model.parameters() if p.is_floating_point()}
    mixed = len(floats) > 1
    if mixed and name == "hf":
        shown = ", ".join(sorted(str(d).removeprefix("torch.") for d in floats))
        raise UsageError(
            f"{files.spec} mixes float dtypes ({shown}): transformers' own pass cannot multiply them",
            hint="cast the model to one dtype (model.to(torch.float32)), or use the own engine, which reads "
            "every weight in float32",
            reason=Reason.DTYPE,
        )
    held = floats.pop() if len(floats) == 1 else torch.float32
    torch_dtype = held if dtype is None else getattr(torch, dtype)
    tok = backend_tokenizer(tokenizer, files)
    if name == "own":
        from ..architectures import build_from, family

        family(files.config)  # an architecture we have not written: before touching a weight
        check_no_hooks(model, files.spec)
        # state_dict() holds detached views of the module's tensors: build_from takes them as they are.
        built = build_from(files.config, dict(model.state_dict()), Path(files.spec), dev, torch_dtype)
        if not mixed:  # the module's own pass cannot run with mixed dtypes: nothing to hold ours to
            check_computes_the_same(model, built, files.spec)
        return OwnEngine(files, dev, torch_dtype, model=built, tokenizer=tok)
    if dev != here or torch_dtype != held:
        raise UsageError(
            f"the hf engine runs the model where and as it is ({here}, {str(held).removeprefix('torch.')})",
            hint="move or cast the model itself (model.to(...)), or use the own engine",
            reason=Reason.HF_IN_PLACE,
        )
    base = getattr(model, "base_model", model)  # a model with a head (…ForMaskedLM): its body
    if getattr(base, "config", None) is None:
        raise ModelLoadError(f"{files.spec} has no base model to read attention from", hint=ACCEPTED)
    return HFEngine(files, dev, torch_dtype, model=base, tokenizer=tok)


# --- the own engine reads a model in memory only where it computes what the module does --

_USE_HF = 'inspect(..., engine="hf") runs the module itself, hooks and edits included'
PROBE_TOKENS = 8


def _not_own(spec: str, what: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"the own engine cannot read {spec}: {what}", hint=_USE_HF, reason=Reason.OWN_MODEL
    )


def check_no_hooks(model: Any, spec: str) -> None:
    """Refuse a model whose modules (or torch, globally) carry forward hooks: the own
    engine runs its own stack on the state_dict, so a hook's change would be left out.

    Raises:
        UnsupportedArchitectureError (facts: reason "own_model"): with the hint to use the hf engine.
    """
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        raise _not_own(spec, "torch has global forward hooks registered, which the own stack would leave out")
    for name, sub in model.named_modules():
        hooks = (*sub._forward_hooks.values(), *sub._forward_pre_hooks.values())
        # transformers' own output recorders (installed on a first output_attentions call)
        # only read what passes; anyone else's hook may change it.
        if any(not str(getattr(hook, "__module__", "")).startswith("transformers.") for hook in hooks):
            where = name or type(model).__name__
            raise _not_own(spec, f"its module {where} carries forward hooks, which the own stack would leave out")


def check_computes_the_same(model: Any, built: Any, spec: str) -> None:
    """One probe pass of ``PROBE_TOKENS`` tokens through the module (eager) and through
    ``built`` (our stack from its config and state_dict): every layer's weights and the
    final hidden states must agree. A config edited after loading (other heads over the
    same shapes, another eps or activation) makes them differ: refused, not answered.

    Encoder-decoders are not probed here (their pass needs decoder inputs).

    Raises:
        UnsupportedArchitectureError (facts: reason "own_model"): they differ.
    """
    import torch

    from ..architectures.base import ForwardOutput
    from .hf_model import eager_for_the_call

    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return
    base = getattr(model, "base_model", model)
    vocab = getattr(config, "vocab_size", None)
    vocab = vocab if isinstance(vocab, int) and vocab >= 1 else 1
    # Ordinary tokens: a padding id inside the text moves RoBERTa's and MPNet's positions,
    # which no tokenized text does.
    special = {getattr(config, f"{k}_token_id", None) for k in ("pad", "bos", "eos", "sep", "cls", "mask", "unk")}
    usable = [i for i in range(min(vocab, PROBE_TOKENS + len(special) + 8)) if i not in special] or [0]
    here = next(iter(base.parameters())).device
    ids = torch.tensor([usable[i % len(usable)] for i in range(PROBE_TOKENS)], device=here)[None]  # (1, T)
    with torch.inference_mode():
        ours = built(ids.to(next(iter(built.parameters())).device), torch.ones_like(ids).to(ids.device))
        if not isinstance(ours, ForwardOutput):
            return
        with eager_for_the_call(model):
            theirs = base(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    low = {p.dtype for p in (*base.parameters(), *built.parameters())} - {torch.float32, torch.float64}
    tol = 2e-2 if low else 1e-4  # half precision rounds each layer
    found = getattr(theirs, "attentions", None) or ()
    pairs = [(a, b) for a, b in zip(ours.attentions, found, strict=False) if b is not None]
    worst = max(
        (
            float((a.double().cpu() - b.double().cpu()).abs().max()) if a.shape == b.shape else math.inf
            for a, b in pairs
        ),
        default=0.0,
    )  # other shapes: another head count than the module's
    what = "attention weights"
    last = getattr(theirs, "last_hidden_state", None)
    if last is not None and last.shape == ours.hidden_states.shape:
        ref = last.double().cpu()
        off = float((ours.hidden_states.double().cpu() - ref).abs().max()) / (1.0 + float(ref.abs().max()))
        if off > worst:
            worst, what = off, "final hidden states"
    if len(pairs) != len(ours.attentions) or not worst <= tol:
        raise _not_own(
            spec,
            f"the module does not compute what its config says (a probe pass differs by {worst:.3g} in its "
            f"{what}: the config was edited after loading, or the modules were)",
        )
