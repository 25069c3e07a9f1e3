"""What the hf engine reads from a loaded transformers model rather than from a list.

    probe(model)          whether the model masks the future (measured on the mask the
                          model itself builds) and which model layer each returned
                          attention tensor belongs to, by one probe pass over a few tokens
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
import re
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Tokens in the causality probe: enough that every query but the last has a later key.
PROBE_TOKENS = 4


@dataclass(frozen=True)
class Probe:
    """What one probe pass of a model shows.

    Attributes:
        causal: no head of any layer gives any weight to a later token.
        layers: the model layer number of each attention tensor transformers returned, in
            order: 0..N-1 for most models, a hybrid's few attention layers for Qwen3-Next,
            Jamba, Bamba, LFM2... (None where the returned tensors could not be traced to
            numbered layers: then they are taken to be layers 0, 1, ... in order).
    """

    causal: bool
    layers: tuple[int, ...] | None
    count: int  # how many attention tensors transformers returned


_NUMBERED_LAYER = re.compile(r"(?:.*\.)?(?:layers|layer|h|block|blocks)\.(\d+)")


def probe(model: Any, device: Any) -> Probe:
    """One forward pass over ``PROBE_TOKENS`` tokens with every token real, read twice.

    Causality: the model is causal exactly when no head of any layer gives any weight to
    a later token. A masked key gets exactly 0 from transformers' eager softmax (the mask
    adds the dtype's minimum); an unmasked one gets exp(s - max) > 0, which would take
    every head of every layer a logit gap over ~100 (float32) to lose, on every probed
    pair. This reads what the model does (its config, its class and the mask it builds)
    instead of a list of model_types, which missed OLMoE and SmolLM3.

    Layer numbers: transformers returns one tensor per layer *with attention*, so a
    hybrid's tuple is shorter than its layers. Each returned tensor is traced to the
    numbered layer (``layers.N``) that was running when a module returned it (forward
    pre-hooks on the layers, forward hooks on their modules: a shared attention block,
    Zamba's, is named by the layer that called it), by identity, not by position.

    Raises:
        EngineError: the model returned no attention weights.
        UnsupportedArchitectureError: it returned weights that are not (B, H, T, T):
            block-sparse attention (LongT5) or a recurrent state (MiniMax).
    """
    import torch

    from ..errors import EngineError

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    vocab = vocab if isinstance(vocab, int) and vocab >= 1 else 1  # a probe of token 0 where unknown
    ids = torch.arange(PROBE_TOKENS, device=device)[None] % vocab  # (1, T)
    state = RotaryState(model)
    running: list[int] = []
    returned: dict[int, int] = {}  # id(weights tensor) -> model layer

    def enter(layer: int) -> Any:
        def hook(module: Any, args: Any) -> None:
            running.append(layer)

        return hook

    def leave(module: Any, args: Any, output: Any) -> None:
        running.pop()

    def seen(module: Any, args: Any, output: Any) -> None:
        if running and isinstance(output, tuple):
            for item in output:
                if isinstance(item, torch.Tensor) and item.dim() == 4:
                    returned.setdefault(id(item), running[-1])

    handles = []
    for name, module in model.named_modules():
        match = _NUMBERED_LAYER.fullmatch(name)
        if match and not any(
            part.isascii() and part.isdigit() for part in name.split(".")[:-1]
        ):  # a layer, not a module inside one
            handles.append(module.register_forward_pre_hook(enter(int(match[1]))))
            handles.append(module.register_forward_hook(leave))
            handles.extend(m.register_forward_hook(seen) for m in module.modules() if m is not module)
    try:
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
        state.restore()
    attentions = getattr(out, "attentions", None)
    if not attentions or any(a is None for a in attentions):
        raise EngineError(
            "transformers returned no attention weights for this model",
            hint="its attention implementation does not expose weights (attnviz check --list says what runs where)",
        )
    odd = next((a for a in attentions if a.dim() != 4 or tuple(a.shape[-2:]) != (PROBE_TOKENS, PROBE_TOKENS)), None)
    if odd is not None:
        from ..errors import UnsupportedArchitectureError

        raise UnsupportedArchitectureError(
            f"transformers returns attention of shape {tuple(odd.shape)} for {PROBE_TOKENS} tokens, not "
            f"(batch, heads, {PROBE_TOKENS}, {PROBE_TOKENS}): block-sparse attention or a recurrent state, "
            "with no weight of each token over the text to show",
            model_type=str(getattr(getattr(model, "config", None), "model_type", "?")),
            engine="none",
        )
    later = torch.ones(PROBE_TOKENS, PROBE_TOKENS, dtype=torch.bool, device=device).triu(1)  # (T, T): key after query
    causal = all(bool((a[..., later] == 0).all()) for a in attentions)
    traced = [returned.get(id(a)) for a in attentions]
    layers = tuple(t for t in traced if t is not None)
    if len(layers) != len(traced) or list(layers) != sorted(set(layers)):
        return Probe(causal, None, len(traced))
    return Probe(causal, layers, len(traced))


def is_causal(model: Any, device: Any) -> bool:
    """Whether ``model`` (a transformers base model or encoder, eager attention) is
    causal (``probe``).

    Raises:
        EngineError: the model returned no attention weights.
    """
    return probe(model, device).causal


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
