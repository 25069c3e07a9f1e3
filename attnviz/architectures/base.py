"""What every from-scratch model family shares: the output type, the model base
class, activations, and reading a checkpoint's weights into our own module names.

torch + safetensors only: nothing here imports transformers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ModelLoadError, UnsupportedArchitectureError
from ..nn import cache as kv_cache
from ..nn import taps
from ..nn.rows import RowRequest
from ..shape import ModelShape


@dataclass
class ForwardOutput:
    """One forward pass.

    Attributes:
        hidden_states: (B, S, E) output of the last layer computed.
        attentions: one (B, H, R, S) tensor per layer computed, first layer first: the
            rows asked for (R = S for every row), or none (R = 0) in a layer not asked for.
        value_norms: with the norm measure (``attnviz.measures.norms``), one (B, H, S) tensor per
            entry of ``attentions``: ‖f_h(x_j)‖ of every head and key; None otherwise.
    """

    hidden_states: Tensor
    attentions: list[Tensor]
    value_norms: list[Tensor] | None = None


class AttnModel(nn.Module):
    """Base class of our transformer stacks. Subclasses set the attributes below
    in ``__init__`` and implement ``forward``."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    causal: bool
    max_positions: int | None
    # Learned per-head sink logits: the weights of a row sum to 1 - the sink's share.
    attention_sinks: bool = False
    # A hybrid's layers with softmax attention, by model layer number (() = every layer);
    # its forward returns weights for these alone (``ModelShape.attention_layers``).
    attention_layers: tuple[int, ...] = ()

    @property
    def shape(self) -> ModelShape:
        return ModelShape(
            self.num_layers,
            self.num_heads,
            self.num_kv_heads,
            self.causal,
            self.attention_sinks,
            attention_layers=self.attention_layers,
        )

    def forward(  # pragma: no cover - interface
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_layer: int | None = None,
        *,
        layers: Collection[int] | None = None,
        queries: Sequence[int] | None = None,
        fused: bool = True,
    ) -> ForwardOutput:
        """input_ids (B, S), attention_mask (B, S) of 1/0; stop after layer ``max_layer``.

        ``layers`` (default all) return the weight rows of ``queries`` (default every
        row); the other layers return none. ``fused=False`` runs the eager reference.
        What a pass reads or changes inside a layer goes through the taps (nn/taps.py).
        """
        raise NotImplementedError

    @staticmethod
    def row_requests(
        last: int,
        layers: Collection[int] | None,
        queries: Sequence[int] | None,
        fused: bool,
    ) -> list[RowRequest]:
        """Per layer 0..last: what its attention returns beside its output. Inside
        ``rows.streaming``, a fused layer asked for every row streams its blocks of rows
        to the sink (with its layer number) and keeps none."""
        from functools import partial

        from ..nn.rows import stream

        wanted = RowRequest(None if queries is None else tuple(queries), fused)
        nothing = RowRequest((), fused)
        sink = stream() if queries is None and fused else None
        out = []
        for layer in range(last + 1):
            if layers is not None and layer not in layers:
                out.append(nothing)
            elif sink is not None:
                out.append(RowRequest(None, True, blocks=partial(sink, layer)))
            else:
                out.append(wanted)
        return out


def layer_loop(
    x: Tensor, count: int, layer: Callable[[int, Tensor], tuple[Tensor, Any]], prefix: str = "blocks"
) -> tuple[Tensor, list[Any]]:
    """The layer loop of every stack: layers 0..count-1 in turn, each ``layer(n, x)`` ->
    (its output (B, L, E), what it returns beside it: its weights). Here, and nowhere else,
    the residual stream passes the taps ``{prefix}.N.resid_pre`` and ``.resid_post``
    (nn/taps.py), and each layer's attention and blocks learn their taps' prefix.

    Returns the last output and the list of what the layers returned beside it."""
    site = taps.active()  # None unless a pass attached taps
    cache = kv_cache.active()  # None unless generation runs (nn/cache.py)
    beside: list[Any] = []
    for n in range(count):
        if cache is not None:
            cache.layer = n
        if site is not None:
            site.layer = f"{prefix}.{n}"
            x = site("resid_pre", x)
        x, extra = layer(n, x)
        if site is not None:
            site.layer = f"{prefix}.{n}"  # a layer may run a stack of its own (an encoder inside)
            x = site("resid_post", x)
        beside.append(extra)
    return x, beside


# --- activations ---------------------------------------------------------------


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's ``gelu_new``: the tanh approximation of GELU."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": nn.functional.gelu,  # exact, erf-based: BERT's
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "relu": nn.functional.relu,
    "relu2": lambda x: torch.square(nn.functional.relu(x)),  # Nemotron's, Arcee's: ReLU squared
    "silu": nn.functional.silu,
    "swish": nn.functional.silu,
}


def activation(name: str) -> Callable[[Tensor], Tensor]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"activation {name!r} is not implemented by the own engine", setting=f"hidden_act={name}"
        ) from None


# --- checkpoint reading --------------------------------------------------------


Rules = Iterable[tuple[str, str]]


def rename(tensors: Mapping[str, Tensor], rules: Rules, prefixes: Iterable[str] = ()) -> dict[str, Tensor]:
    """Map checkpoint names to our module names.

    Each name first loses any of ``prefixes`` (``bert.``, ``model.``, ...), then the
    first matching ``(regex, replacement)`` rule renames it (``re.fullmatch``).
    Names no rule matches (pooler, LM heads, buffers) are dropped.
    """
    compiled = [(re.compile(pattern), repl) for pattern, repl in rules]
    prefixes = tuple(prefixes)
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        # Old TF-converted checkpoints call LayerNorm parameters gamma/beta.
        name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
        for pattern, repl in compiled:
            if pattern.fullmatch(name):
                out[pattern.sub(repl, name)] = tensor
                break
    return out


def load_into(model: nn.Module, tensors: dict[str, Tensor], model_dir: Path) -> None:
    """Load renamed tensors into a model built on the meta device (``assign=True``
    takes the tensors as they are: no random init, no copy)."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ModelLoadError(
            f"{model_dir} lacks weights the model needs: {shown}",
            hint="the checkpoint is incomplete, or not the architecture its config.json claims",
        )
    for name, param in expected.items():
        if tuple(tensors[name].shape) != tuple(param.shape):
            raise ModelLoadError(
                f"weight {name} has shape {tuple(tensors[name].shape)}, the config implies {tuple(param.shape)}",
                hint="config.json and the weights disagree: the checkpoint is corrupt or mixed up",
            )
    model.load_state_dict({k: tensors[k] for k in expected}, strict=True, assign=True)


def config_value(config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    """The first of ``names`` present in ``config`` (families name the same thing differently)."""
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default
