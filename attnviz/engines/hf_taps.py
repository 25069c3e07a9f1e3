"""The taps (nn/taps.py) on transformers' modules: the hf engine's ``tapping``.

The same names as the own engine, found in transformers' models:

    scores                not mapped (UnsupportedArchitectureError): our modules' terms
    q, k, v, pattern      in the attention function: while taps are attached,
                          transformers' attention interface's "eager" entry is a wrapper
                          (``AttentionInterface``) that taps the queries and keys as the
                          function gets them (after RoPE), the values, then calls the
                          family's own ``eager_attention_forward`` and taps the weights
                          (a replaced pattern: the output is recomputed as weights · V);
                          v alone, in a family that computes its attention without the
                          interface (DeBERTa): the value projection's output, in heads;
                          GPT-2 with ``reorder_and_upcast_attn``: its own method, wrapped
                          on the instance the same way (``_OWN_PATHS``)
    z                     a forward pre-hook on W^O (hf_layout's ``W_O``): its input is Concat(heads),
                          (B, Q, H·Dv), seen as (B, Q, H, Dv); a replacement may return
                          another batch (copies of the stream)
    out                   a forward hook on W^O
    resid_pre/resid_post  a forward pre-hook / hook on each layer module
    attn_out              W^O's output (the attention's contribution as transformers
                          adds it) in the families without a norm or scale after it
    mlp_out / cross_out   a forward hook on the MLP module / the cross-attention's W^O

Which module is which is hf_layout.py's (``W_O``, ``PATTERNS``). Beside them,
the engine's load-time ``probe``: whether the model masks the future and which layer each
attention tensor transformers returns belongs to, traced by hooks on its layers.
A tap this model's layout does not map raises ``UnsupportedArchitectureError`` when it
is attached, never a silent identity; one a pass through its stack never reached
(transformers computed it elsewhere), as the block is left (``_check_reached``), never an
empty record. This is the only module that hooks a module: an analysis never does. torch
and transformers, imported inside the functions.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedArchitectureError
from ..nn.taps import ATTENTION_TAPS, Taps, kind_of
from .hf_layout import OTHER_SUBLAYERS, STREAMS_FIRST, output_projections, role_modules
from .hf_model import RotaryState

if TYPE_CHECKING:
    from torch import Tensor


class _Sites:
    """Which tap names each hooked module's calls go to: a module shared by several layers
    (ALBERT's) is called once per layer, in order, so its n-th call is layer n mod its count."""

    def __init__(self) -> None:
        self.names: dict[int, list[str]] = {}
        self.calls: dict[int, int] = {}

    def add(self, module: Any, prefix: str) -> None:
        self.names.setdefault(id(module), []).append(prefix)

    def next(self, module: Any) -> str | None:
        names = self.names.get(id(module))
        if names is None:
            return None
        count = self.calls.get(id(module), 0)
        self.calls[id(module)] = count + 1
        return names[count % len(names)]


# The attention functions' taps of the running pass: (taps, modules -> name prefixes).
_FUNCTION: contextvars.ContextVar[tuple[Taps, _Sites] | None] = contextvars.ContextVar("attnviz_hf_taps", default=None)


def _tapped_eager(
    module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any, *args: Any, **kwargs: Any
) -> Any:
    """transformers' eager attention of ``module``'s family, with the taps q, k, v and pattern."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:  # pragma: no cover - _check_function refuses such a model first
        raise UnsupportedArchitectureError(f"{type(module).__name__} has no eager_attention_forward to tap")
    return _tapped(module, partial(eager, module), query, key, value, attention_mask, *args, **kwargs)


def _tapped(
    module: Any, attend: Callable[..., Any], query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any
) -> Any:
    """``attend(query, key, value, *args, **kwargs)`` -> (output, weights), transformers'
    attention of ``module``, with the taps q, k, v and pattern of the site ``module`` is."""
    running = _FUNCTION.get()
    prefix = None if running is None else running[1].next(module)
    if running is None or prefix is None:
        return attend(query, key, value, *args, **kwargs)
    taps = running[0]
    query, key, value = (taps.apply(f"{prefix}.{w}", t) for w, t in (("q", query), ("k", key), ("v", value)))
    output, weights = attend(query, key, value, *args, **kwargs)  # (B, Q, H, Dv), (B, H, Q, S)
    if weights is not None:
        patched = taps.apply(f"{prefix}.pattern", weights)
        if patched is not weights:  # a replaced pattern: each head's output is its weights · V
            from ..nn.taps import replaced_pattern

            output, weights = replaced_pattern(patched, query, value).transpose(1, 2).contiguous(), patched
    return output, weights


# Attention modules' own methods that transformers calls instead of the attention
# interface under a config flag, with the interface's (query, key, value, mask) and its
# (output, weights): GPT-2's ``reorder_and_upcast_attn`` (float32 scores by baddbmm).
# While taps are attached, each such module's method is wrapped (``_tapped``) on the
# instance, so that its q, k, v and pattern are the values that path computes with.
_OWN_PATHS: dict[str, str] = {"reorder_and_upcast_attn": "_upcast_and_reordered_attn"}


@contextlib.contextmanager
def _own_paths(modules: Sequence[Any]) -> Iterator[None]:
    """Wrap the methods of ``_OWN_PATHS`` of those ``modules`` whose flag is set."""
    wrapped: list[tuple[Any, str]] = []
    try:
        for module in {id(m): m for m in modules}.values():
            for flag, method in _OWN_PATHS.items():
                if getattr(module, flag, False) and callable(getattr(module, method, None)):
                    attend = getattr(module, method)
                    setattr(module, method, partial(_tapped, module, attend))
                    wrapped.append((module, method))
        yield
    finally:
        for module, method in wrapped:
            delattr(module, method)  # the class's method again


def _first(output: Any) -> Any:
    return output[0] if isinstance(output, tuple) else output


def _with_first(output: Any, value: Any) -> Any:
    return (value, *output[1:]) if isinstance(output, tuple) else value


@contextlib.contextmanager
def tapping(
    model: Any,
    taps: Taps,
    layer_stacks: dict[str, int],
    heads: dict[str, int],
    model_type: str,
    attention_layers: Sequence[int] | None = None,
) -> Iterator[Taps]:
    """Inside the block, passes through ``model`` (a transformers base model) apply ``taps``.

    Args:
        layer_stacks: layers per name stack, {"blocks": N} for one stack or an encoder,
            plus "decoder.blocks" for a decoder (whose cross-attention is
            decoder.blocks.N.cross...).
        heads: query heads per name stack, as ``layer_stacks``.
        attention_layers: a hybrid's layers with attention (None: every layer); the
            others have no attention taps.

    Raises:
        UnsupportedArchitectureError: a tap attached that this model's layout does not map.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    wanted = {kind_of(p) for p in taps.patterns}
    if "scores" in wanted:
        raise UnsupportedArchitectureError(
            "the hf engine does not tap scores (the terms our own attention modules score with); "
            "transformers computes them in its own code: the own engine taps them",
            model_type=model_type,
        )
    function_sites, out_sites = _Sites(), _Sites()
    handles: list[Any] = []
    attending: list[Any] = []  # the attention modules whose function is tapped
    ran: set[str] = set()  # the stacks whose attention a pass ran

    def need(found: list[Any] | None, what: str, part: str) -> list[Any]:
        if found is None:
            raise UnsupportedArchitectureError(
                f"the hf engine cannot find where transformers' {model_type!r} model computes {what} ({part})",
                model_type=model_type,
            )
        return found

    def hook_output(module: Any, name: str, streams: bool = False) -> None:
        def hook(_: Any, __: Any, output: Any) -> Any:
            new = _applied(taps, name, _first(output), streams)
            return _with_first(output, new)

        handles.append(module.register_forward_hook(hook))

    try:
        for stack, layers in layer_stacks.items():
            part = "decoder" if stack == "decoder.blocks" else "encoder"
            roles = [("attention", "attn", part)] + ([("attention", "cross", "cross")] if part == "decoder" else [])
            # q, k, v, pattern: in the attention function (v alone: the value projection
            # where the family computes its attention without the interface)
            if wanted & {"q", "k", "v", "pattern", "*"}:
                for _, role, which in roles:
                    hybrid = attention_layers if stack == "blocks" else None
                    found = need(role_modules(model, which, "attention", layers, hybrid), "its attention", which)
                    if wanted == {"v"} and not _through_interface(next(m for m in found if m is not None)):
                        handles.extend(_value_hooks(model, taps, which, stack, layers, heads[stack], model_type))
                        continue
                    _check_function(next(m for m in found if m is not None), model_type)
                    for n, module in enumerate(found):
                        if module is not None:
                            function_sites.add(module, f"{stack}.{n}.{role}")
                            attending.append(module)
            # out (and attn_out, cross_out: the same values where the family adds W^O's output as it is)
            if wanted & {"z", "out", "attn_out", "cross_out", "*"}:
                for _, role, which in roles:
                    hybrid = attention_layers if stack == "blocks" else None
                    projections = output_projections(model, which, layers, hybrid)
                    z_sites = _Sites()
                    for n, module in enumerate(projections):
                        if module is not None:
                            out_sites.add(module, f"{stack}.{n}")
                            z_sites.add(module, f"{stack}.{n}.{role}.z")
                    for module in {id(m): m for m in projections if m is not None}.values():
                        handles.append(module.register_forward_pre_hook(_z_hook(taps, z_sites, heads[stack])))
                        handles.append(module.register_forward_hook(_out_hook(taps, out_sites, role, model_type)))
            # ("*" comes from blocks.N.attn.*, which names no layer tap: nothing to refuse there.)
            if "mlp_out" in wanted and model_type in OTHER_SUBLAYERS:
                raise UnsupportedArchitectureError(
                    f"the hf engine does not map mlp_out for {model_type!r}; the own engine taps it",
                    model_type=model_type,
                )
            if wanted & {"mlp_out", "*"} and model_type not in OTHER_SUBLAYERS:
                for n, module in enumerate(need(role_modules(model, part, "mlp", layers), "its MLP", part)):
                    hook_output(module, f"{stack}.{n}.mlp_out")
            if wanted & {"resid_pre", "resid_post", "*"}:
                streams = model_type in STREAMS_FIRST
                for n, module in enumerate(need(role_modules(model, part, "layer", layers), "its layers", part)):
                    handles.append(
                        module.register_forward_pre_hook(
                            _pre_hook(taps, f"{stack}.{n}.resid_pre", streams), with_kwargs=True
                        )
                    )
                    hook_output(module, f"{stack}.{n}.resid_post", streams)
            handles.extend(_running(model, part, layers, attention_layers if stack == "blocks" else None, ran, stack))
        installed = "eager" in ALL_ATTENTION_FUNCTIONS._local_mapping
        previous = ALL_ATTENTION_FUNCTIONS._local_mapping.get("eager")
        ALL_ATTENTION_FUNCTIONS["eager"] = _tapped_eager
        token = _FUNCTION.set((taps, function_sites))
        earlier, taps.reached = taps.reached, set()
        try:
            with _own_paths(attending):
                yield taps
            _check_reached(taps, ran, model_type)
        finally:
            taps.reached |= earlier
            _FUNCTION.reset(token)
            if installed:
                ALL_ATTENTION_FUNCTIONS["eager"] = previous
            else:
                del ALL_ATTENTION_FUNCTIONS["eager"]
    finally:
        for handle in handles:
            handle.remove()


def _running(model: Any, part: str, layers: int, present: Sequence[int] | None, ran: set[str], stack: str) -> list[Any]:
    """Pre-hooks that add ``stack`` to ``ran`` when a pass runs its attention (none where
    the patterns find no attention modules: then nothing is checked after the pass)."""
    found = role_modules(model, part, "attention", layers, present)
    if found is None:
        return []

    def hook(_: Any, __: Any) -> None:
        ran.add(stack)

    return [m.register_forward_pre_hook(hook) for m in {id(m): m for m in found if m is not None}.values()]


def _check_reached(taps: Taps, ran: set[str], model_type: str) -> None:
    """After the passes: every tap attached to a stack whose attention ran was reached.

    Raises:
        UnsupportedArchitectureError: one was not: transformers computed it on a path the
            taps are not on, so it recorded nothing (or a replacement changed nothing).
    """
    missed = [p for p in taps.never_reached() if ("decoder.blocks" if p.startswith("decoder.") else "blocks") in ran]
    if missed:
        raise UnsupportedArchitectureError(
            f"transformers' {model_type!r} model computed {', '.join(missed)} where the hf engine's taps "
            "are not, so nothing was recorded or replaced there",
            model_type=model_type,
        )


def _out_hook(taps: Taps, sites: _Sites, role: str, model_type: str) -> Callable[..., Any]:
    """W^O's output: the taps ``{layer}.{role}.out`` and, where the family adds it to the
    stream as it is, ``{layer}.attn_out`` / ``.cross_out``."""
    sublayer = "cross_out" if role == "cross" else "attn_out"

    def hook(module: Any, _: Any, output: Any) -> Any:
        layer = sites.next(module)
        if layer is None:  # pragma: no cover - every hooked module has a site
            return None
        value = taps.apply(f"{layer}.{role}.out", _first(output))
        if taps.wants(f"{layer}.{sublayer}"):
            if model_type in OTHER_SUBLAYERS:
                raise UnsupportedArchitectureError(
                    f"the hf engine does not map {sublayer} for {model_type!r}; the own engine taps it",
                    model_type=model_type,
                )
            value = taps.apply(f"{layer}.{sublayer}", value)
        return _with_first(output, value)

    return hook


def _z_hook(taps: Taps, sites: _Sites, num_heads: int) -> Callable[..., Any]:
    """W^O's input Concat(heads) (B, Q, H·Dv) as the tap z (B, Q, H, Dv), and back."""

    def hook(module: Any, args: tuple[Any, ...]) -> Any:
        name = sites.next(module)
        if name is None or not taps.wants(name):
            return None
        concat, *rest = args
        b, length, width = concat.shape
        z = taps.apply(name, concat.view(b, length, num_heads, width // num_heads))  # (B', Q, H, Dv)
        return (z.reshape(z.size(0), length, width), *rest)

    return hook


def _applied(taps: Taps, name: str, value: Any, streams_first: bool) -> Any:
    """``taps.apply`` at ``name``; a streams-first value (A, B, Q, E) is seen as (B, Q, A, E)."""
    if not streams_first:
        return taps.apply(name, value)
    return taps.apply(name, value.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)


def _pre_hook(taps: Taps, name: str, streams_first: bool = False) -> Callable[..., Any]:
    def hook(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            return (_applied(taps, name, args[0], streams_first), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": _applied(taps, name, kwargs["hidden_states"], streams_first)}

    return hook


def _through_interface(module: Any) -> bool:
    """Whether ``module``'s family computes its attention through transformers' attention
    interface (``eager_attention_forward``, looked up in ``ALL_ATTENTION_FUNCTIONS``)."""
    family = sys.modules[type(module).__module__]
    return hasattr(family, "eager_attention_forward") and hasattr(family, "ALL_ATTENTION_FUNCTIONS")


def _value_hooks(
    model: Any, taps: Taps, part: str, stack: str, layers: int, num_heads: int, model_type: str
) -> list[Any]:
    """The v tap on the value projections' outputs (B, S, G·Dv), seen as (B, G, S, Dv): a
    family whose attention does not go through the interface (DeBERTa)."""
    values = role_modules(model, part, "value", layers)
    if values is None:
        raise UnsupportedArchitectureError(
            f"transformers' {model_type!r} attention does not go through its attention interface, so the hf "
            f"engine cannot tap {', '.join(ATTENTION_TAPS[:5])} there; the own engine taps them",
            model_type=model_type,
        )
    dims = [m.in_features // num_heads for m in output_projections(model, part, layers)]
    sites = _Sites()
    for n, module in enumerate(values):
        sites.add(module, f"{stack}.{n}.attn.v")

    def hook(module: Any, _: Any, out: Any) -> Any:
        name = sites.next(module)
        if name is None or not taps.wants(name):
            return None
        b, s, width = out.shape
        d = dims[int(name.split(".")[-3])]
        v = taps.apply(name, out.view(b, s, width // d, d).transpose(1, 2))  # (B, G, S, Dv)
        return v.transpose(1, 2).reshape(v.size(0), s, width)

    return [module.register_forward_hook(hook) for module in {id(m): m for m in values}.values()]


def _check_function(module: Any, model_type: str) -> None:
    """The family computes its attention through transformers' attention interface."""
    if not _through_interface(module):
        raise UnsupportedArchitectureError(
            f"transformers' {model_type!r} attention does not go through its attention interface, so the hf "
            f"engine cannot tap {', '.join(ATTENTION_TAPS[:5])} there; the own engine taps them",
            model_type=model_type,
        )


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
