"""What the hf engine reads from a loaded transformers model rather than from a list.

    head_projections      the W^O modules that have a separate value projection beside
                          them (the norm measure's f_h), family by family
    RotaryState(model)    the state transformers' dynamic RoPE keeps between calls
                          (``inv_freq`` grown for the longest input so far), saved once
                          and put back before every pass, so that each pass sees a
                          freshly loaded model, as the own engine's pure function does
    runs_past_positions   dynamic RoPE exists to run past max_position_embeddings, and
                          ALiBi has no position table
    adds_alibi_twice      an ALiBi Falcon whose eager attention adds the bias twice
                          (transformers before 5.25)

Imports torch lazily; never imports transformers itself (it takes the model as given).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any


def _rotary_modules(model: Any) -> list[Any]:
    """transformers' rotary embedding modules: they keep ``original_max_seq_len``."""
    return [m for m in model.modules() if hasattr(m, "original_max_seq_len") and hasattr(m, "rope_type")]


def _rope_types(module: Any) -> list[str]:
    kind = getattr(module, "rope_type", None)
    values = kind.values() if isinstance(kind, dict) else [kind]
    return [str(v) for v in values if v is not None]


def runs_past_positions(model: Any) -> bool:
    """Whether max_position_embeddings is the length the model was trained on, not a
    limit: its RoPE is dynamic (NTK-aware, grown with the input), or it is an ALiBi
    Falcon (Falcon-RW), whose positions are a score bias with no table to run out of."""
    if _alibi_falcon(model):
        return True
    return any("dynamic" in kind for m in _rotary_modules(model) for kind in _rope_types(m))


def _alibi_falcon(model: Any) -> bool:
    """Whether ``model`` is a Falcon with ``alibi`` on (Falcon-RW)."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) == "falcon" and bool(getattr(config, "alibi", False))


def adds_alibi_twice(model: Any) -> bool:
    """Whether ``model`` is an ALiBi Falcon (Falcon-RW) whose eager attention adds the bias
    twice: transformers 5.0 to 5.24 fold the bias into the mask for every attention path
    and their ``FalconAttention`` adds it to the scores again (an ``alibi`` argument); from
    5.25 on the mask alone carries it, and eager agrees with SDPA. Read from the code the
    model runs, not from a version number.
    """
    import inspect

    if not _alibi_falcon(model):
        return False
    return any(
        type(m).__name__ == "FalconAttention" and "alibi" in inspect.signature(type(m).forward).parameters
        for m in model.modules()
    )


class RotaryState:
    """The mutable state of a model's rotary modules, saved on creation.

    transformers' dynamic RoPE grows ``inv_freq`` when an input is longer than any seen
    before and keeps it for later, shorter inputs (it resets only below
    max_position_embeddings), so the same sentence gets other weights after a longer one.
    ``restore`` puts back the state saved, so each pass is that of a fresh model.
    """

    def __init__(self, model: Any) -> None:
        self._saved: list[tuple[Any, dict[str, Any], dict[str, Any]]] = []
        for module in _rotary_modules(model):
            buffers = {name: b.clone() for name, b in module.named_buffers(recurse=False) if b is not None}
            plain = {
                name: value
                for name, value in vars(module).items()
                if name.endswith(("max_seq_len_cached", "attention_scaling", "long_inv_freq"))
            }
            self._saved.append((module, buffers, plain))

    def restore(self) -> None:
        for module, buffers, plain in self._saved:
            persistent = set(module.state_dict(keep_vars=True).keys())
            for name, value in buffers.items():
                module.register_buffer(name, value.clone(), persistent=name in persistent)
            for name in list(vars(module)):
                if name.endswith(("max_seq_len_cached", "attention_scaling", "long_inv_freq")) and name not in plain:
                    delattr(module, name)
            for name, value in plain.items():
                setattr(module, name, value)


# One lock per model in memory: the eager switch is a setting of the shared module, so a
# thread restoring sdpa under another's forward pass gave that pass other weights
# (measured: 0.99 off, exit 0). Re-entrant: an analysis may run inside a run.
_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


def model_lock(model: Any) -> threading.RLock:
    """The lock that serialises runs on ``model`` (one per model object)."""
    with _LOCKS_LOCK:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


@contextlib.contextmanager
def eager_for_the_call(model: Any) -> Iterator[None]:
    """A transformers model in memory switched to eager attention (sdpa and flash attention
    return no weights) and eval mode (no dropout) for the ``with`` block, both restored after.
    Other threads' blocks on the same model wait (``model_lock``)."""
    with model_lock(model):
        yield from _eager(model)


def _eager(model: Any) -> Iterator[None]:
    config = model.config
    attn = getattr(config, "_attn_implementation", None)
    experts = getattr(config, "_experts_implementation", None)
    training = bool(model.training)
    try:
        if attn != "eager":
            model.set_attn_implementation("eager")
        if experts not in (None, "eager") and hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")
        model.eval()
        yield
    finally:
        if attn is not None and attn != "eager":
            model.set_attn_implementation(attn)
        if experts not in (None, "eager") and hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation(experts)
        model.train(training)


# transformers' W^O modules -> the value projection beside them, family by family. A family
# whose values come out of a fused q/k/v projection (GPT-2's c_attn, Phi-3's qkv_proj,
# ModernBERT's Wqkv) has none here, and the hf engine refuses norms for it.
_HF_SIBLINGS = (
    ("attention.output.dense", ("attention.self.value", "attention.self.value_proj")),  # BERT-likes, DeBERTa
    ("attention.out_lin", ("attention.v_lin",)),  # DistilBERT
    ("attention.dense", ("attention.value",)),  # ALBERT
    ("self_attn.o_proj", ("self_attn.v_proj",)),  # Llama-likes
    ("attn.Wo", ("attn.v_proj",)),  # ModernBERT-decoder
    ("SelfAttention.o", ("SelfAttention.v",)),  # T5
    ("EncDecAttention.o", ("EncDecAttention.v",)),
    ("self_attn.out_proj", ("self_attn.v_proj",)),  # BART
    ("encoder_attn.out_proj", ("encoder_attn.v_proj",)),
)


# transformers' names of fused q/k/v projections (GPT-2, Phi-3, ModernBERT, GPT-NeoX, Falcon).
_FUSED = ("c_attn", "qkv_proj", "Wqkv", "query_key_value")


class NoProjections(ValueError):
    """transformers' model keeps no separate value projection and W^O we can read."""


def head_projections(model: Any) -> list[tuple[str, str, Any]]:
    """transformers' W^O of each attention module with a separate value projection beside
    it: (module name, part "encoder" / "decoder" / "cross", W^O), in module order.

    Raises:
        NoProjections: an attention whose value projection is fused with q and k, or none
            found at all; its message names the module.
    """
    from torch.nn import Linear

    modules = dict(model.named_modules())
    fused = next((n for n in modules if n.rsplit(".", 1)[-1] in _FUSED), None)
    if fused is not None:
        raise NoProjections(f"{fused} computes q, k and v in one fused projection")
    found: list[tuple[str, str, Any]] = []
    for name, module in modules.items():
        for o_suffix, v_suffixes in _HF_SIBLINGS:
            if not name.endswith(o_suffix) or (name != o_suffix and not name.endswith("." + o_suffix)):
                continue
            base = name[: -len(o_suffix)]
            v = next((modules[base + s] for s in v_suffixes if base + s in modules), None)
            if not isinstance(v, Linear) or not isinstance(module, Linear):
                raise NoProjections(f"{name} has no separate value projection beside it")
            part = "cross" if o_suffix.startswith(("EncDec", "encoder_attn")) else "encoder"
            if part == "encoder" and name.startswith("decoder."):
                part = "decoder"
            found.append((name, part, module))
            break
    if not found:
        raise NoProjections("no attention output projection with a separate value projection beside it")
    return found
