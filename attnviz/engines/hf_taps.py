"""The taps (nn/taps.py) on transformers' modules: the hf engine's ``tapping``.

The same names as the own engine, found in transformers' models:

    q, k, v, pattern      in the attention function: while taps are attached,
                          transformers' attention interface's "eager" entry is a wrapper
                          (``AttentionInterface``) that taps the queries and keys as the
                          function gets them (after RoPE), the values, then calls the
                          family's own ``eager_attention_forward`` and taps the weights
                          (a replaced pattern: the output is recomputed as weights · V)
    z                     a forward pre-hook on W^O (``W_O``): its input is Concat(heads),
                          (B, Q, H·Dv), seen as (B, Q, H, Dv); a replacement may return
                          another batch (copies of the stream)
    out                   a forward hook on W^O
    resid_pre/resid_post  a forward pre-hook / hook on each layer module
    attn_out              W^O's output (the attention's contribution as transformers
                          adds it) in the families without a norm or scale after it
    mlp_out / cross_out   a forward hook on the MLP module / the cross-attention's W^O

Which module is which is read from the module names of the base model (``PATTERNS``),
one pattern per layout. A tap this model's layout does not map
raises ``UnsupportedArchitectureError`` when it is attached, never a silent identity.
This is the only module that hooks a module: an analysis never
does. torch and transformers, imported inside the functions.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedArchitectureError
from ..nn.taps import ATTENTION_TAPS, Taps, kind_of

if TYPE_CHECKING:
    from torch import Tensor

_N = r"(\d+)"
# Per part: W^O, the module whose input is Concat(heads) (the taps z, out, attn_out).
W_O: dict[str, tuple[str, ...]] = {
    "encoder": (
        rf"(?:encoder\.)?layer\.{_N}\.attention\.output\.dense",
        rf"transformer\.layer\.{_N}\.attention\.out_lin",
        rf"h\.{_N}\.attn\.c_proj",
        rf"layers\.{_N}\.self_attn\.o_proj",
        rf"layers\.{_N}\.attn\.Wo",
        rf"encoder\.layers\.{_N}\.self_attn\.out_proj",
        rf"encoder\.block\.{_N}\.layer\.0\.SelfAttention\.o",
    ),
    "decoder": (
        rf"decoder\.layers\.{_N}\.self_attn\.out_proj",
        rf"decoder\.block\.{_N}\.layer\.0\.SelfAttention\.o",
    ),
    "cross": (
        rf"decoder\.layers\.{_N}\.encoder_attn\.out_proj",
        rf"decoder\.block\.{_N}\.layer\.1\.EncDecAttention\.o",
    ),
}
_ALBERT = "encoder.albert_layer_groups.0.albert_layers.0.attention.dense"


def output_projections(
    model: Any, part: str, num_layers: int, attention_layers: Sequence[int] | None = None
) -> list[Any]:
    """Per layer 0..num_layers-1 of ``part``: the module whose input is Concat(heads);
    None for the layers of a hybrid that have no attention (``attention_layers``: those
    that do; None = every layer).

    Raises:
        UnsupportedArchitectureError: this model's layout is not in W_O.
    """
    modules = dict(model.named_modules())
    if part == "encoder" and _ALBERT in modules and getattr(model.config, "num_hidden_groups", 1) == 1:
        return [modules[_ALBERT]] * num_layers
    wanted = list(range(num_layers)) if attention_layers is None else sorted(attention_layers)
    for pattern in W_O[part]:
        found: dict[int, Any] = {}
        for name, module in modules.items():
            match = re.fullmatch(pattern, name)
            if match:
                found[int(match.group(1))] = module
        if sorted(found) == wanted:
            return [found.get(layer) for layer in range(num_layers)]
    # One stack's attention is "self-attention"; "encoder" only where there is a decoder.
    what = f"{part} attention" if getattr(model.config, "is_encoder_decoder", False) else "self-attention"
    raise UnsupportedArchitectureError(
        f"the hf engine cannot find the output projections (W^O) of {type(model).__name__}'s {what} to tap its heads",
        model_type=str(getattr(model.config, "model_type", "?")),
    )


# Per part and role: the module names' patterns, the layer number in the group.
PATTERNS: dict[tuple[str, str], tuple[str, ...]] = {
    # the module that calls the attention function
    ("encoder", "attention"): (
        rf"(?:encoder\.)?layer\.{_N}\.attention\.self",
        rf"h\.{_N}\.attn",
        rf"layers\.{_N}\.self_attn",
        rf"layers\.{_N}\.attn",
        rf"encoder\.layers\.{_N}\.self_attn",
        rf"encoder\.block\.{_N}\.layer\.0\.SelfAttention",
    ),
    ("decoder", "attention"): (
        rf"decoder\.layers\.{_N}\.self_attn",
        rf"decoder\.block\.{_N}\.layer\.0\.SelfAttention",
    ),
    ("cross", "attention"): (
        rf"decoder\.layers\.{_N}\.encoder_attn",
        rf"decoder\.block\.{_N}\.layer\.1\.EncDecAttention",
    ),
    # one layer of the stack
    ("encoder", "layer"): (
        rf"(?:encoder\.)?layer\.{_N}",
        rf"h\.{_N}",
        rf"layers\.{_N}",
        rf"encoder\.layers\.{_N}",
        rf"encoder\.block\.{_N}",
    ),
    ("decoder", "layer"): (rf"decoder\.layers\.{_N}", rf"decoder\.block\.{_N}"),
    # the MLP's output, before any dropout, norm or residual
    ("encoder", "mlp"): (
        rf"(?:encoder\.)?layer\.{_N}\.output\.dense",
        rf"h\.{_N}\.mlp",
        rf"layers\.{_N}\.mlp",
        rf"encoder\.layers\.{_N}\.fc2",
        rf"encoder\.block\.{_N}\.layer\.1\.DenseReluDense",
    ),
    ("decoder", "mlp"): (rf"decoder\.layers\.{_N}\.fc2", rf"decoder\.block\.{_N}\.layer\.2\.DenseReluDense"),
}
# Families whose attention output is normed or scaled before it joins the stream (their
# attn_out is not W^O's output) or whose blocks these patterns misread: attn_out and
# mlp_out are not mapped for them (the own engine taps them).
_OTHER_SUBLAYERS = frozenset({"gemma2", "gemma3_text", "gemma3", "olmo2", "granite", "granitemoe", "bloom"})


def _modules(
    model: Any, part: str, role: str, num_layers: int, present: Sequence[int] | None = None
) -> list[Any] | None:
    """Per layer 0..num_layers-1 of ``part``: the ``role`` module (None in a layer not in
    ``present``, a hybrid's layer without attention); None when no pattern fits."""
    wanted = list(range(num_layers)) if present is None else sorted(present)
    modules = dict(model.named_modules())
    for pattern in PATTERNS.get((part, role), ()):
        found: dict[int, Any] = {}
        for name, module in modules.items():
            match = re.fullmatch(pattern, name)
            if match:
                found[int(match.group(1))] = module
        if sorted(found) == wanted:
            return [found.get(layer) for layer in range(num_layers)]
    return None


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
    running = _FUNCTION.get()
    prefix = None if running is None else running[1].next(module)
    if running is None or prefix is None:
        return eager(module, query, key, value, attention_mask, *args, **kwargs)
    taps = running[0]
    query, key, value = (taps.apply(f"{prefix}.{w}", t) for w, t in (("q", query), ("k", key), ("v", value)))
    output, weights = eager(module, query, key, value, attention_mask, *args, **kwargs)  # (B, Q, H, Dv), (B, H, Q, S)
    if weights is not None:
        patched = taps.apply(f"{prefix}.pattern", weights)
        if patched is not weights:  # a replaced pattern: each head's output is its weights · V
            from ..nn.attention import replaced_pattern

            output, weights = replaced_pattern(patched, query, value).transpose(1, 2).contiguous(), patched
    return output, weights


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
    function_sites, out_sites = _Sites(), _Sites()
    handles: list[Any] = []

    def need(found: list[Any] | None, what: str, part: str) -> list[Any]:
        if found is None:
            raise UnsupportedArchitectureError(
                f"the hf engine cannot find where transformers' {model_type!r} model computes {what} ({part})",
                model_type=model_type,
            )
        return found

    def hook_output(module: Any, name: str) -> None:
        def hook(_: Any, __: Any, output: Any) -> Any:
            new = taps.apply(name, _first(output))
            return _with_first(output, new)

        handles.append(module.register_forward_hook(hook))

    try:
        for stack, layers in layer_stacks.items():
            part = "decoder" if stack == "decoder.blocks" else "encoder"
            roles = [("attention", "attn", part)] + ([("attention", "cross", "cross")] if part == "decoder" else [])
            # q, k, v, pattern, z: in the attention function
            if wanted & {"q", "k", "v", "pattern", "*"}:
                for _, role, which in roles:
                    hybrid = attention_layers if stack == "blocks" else None
                    found = need(_modules(model, which, "attention", layers, hybrid), "its attention", which)
                    _check_function(next(m for m in found if m is not None), model_type)
                    for n, module in enumerate(found):
                        if module is not None:
                            function_sites.add(module, f"{stack}.{n}.{role}")
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
            if wanted & {"mlp_out", "*"}:
                if model_type in _OTHER_SUBLAYERS:
                    raise UnsupportedArchitectureError(
                        f"the hf engine does not map mlp_out for {model_type!r}; the own engine taps it",
                        model_type=model_type,
                    )
                for n, module in enumerate(need(_modules(model, part, "mlp", layers), "its MLP", part)):
                    hook_output(module, f"{stack}.{n}.mlp_out")
            if wanted & {"resid_pre", "resid_post", "*"}:
                for n, module in enumerate(need(_modules(model, part, "layer", layers), "its layers", part)):
                    handles.append(
                        module.register_forward_pre_hook(_pre_hook(taps, f"{stack}.{n}.resid_pre"), with_kwargs=True)
                    )
                    hook_output(module, f"{stack}.{n}.resid_post")
        installed = "eager" in ALL_ATTENTION_FUNCTIONS._local_mapping
        previous = ALL_ATTENTION_FUNCTIONS._local_mapping.get("eager")
        ALL_ATTENTION_FUNCTIONS["eager"] = _tapped_eager
        token = _FUNCTION.set((taps, function_sites))
        try:
            yield taps
        finally:
            _FUNCTION.reset(token)
            if installed:
                ALL_ATTENTION_FUNCTIONS["eager"] = previous
            else:
                del ALL_ATTENTION_FUNCTIONS["eager"]
    finally:
        for handle in handles:
            handle.remove()


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
            if model_type in _OTHER_SUBLAYERS:
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


def _pre_hook(taps: Taps, name: str) -> Callable[..., Any]:
    def hook(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            return (taps.apply(name, args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": taps.apply(name, kwargs["hidden_states"])}

    return hook


def _check_function(module: Any, model_type: str) -> None:
    """The family computes its attention through transformers' attention interface."""
    family = sys.modules[type(module).__module__]
    if not hasattr(family, "eager_attention_forward") or not hasattr(family, "ALL_ATTENTION_FUNCTIONS"):
        raise UnsupportedArchitectureError(
            f"transformers' {model_type!r} attention does not go through its attention interface, so the hf "
            f"engine cannot tap {', '.join(ATTENTION_TAPS[:5])} there; the own engine taps them",
            model_type=model_type,
        )
