"""Gemma 3n text (``gemma3n_text``): Gemma 4's attention (gemma4.py: the w-not-1+w norm,
q/k norms, a weightless v norm, scale 1, cross-layer key/value sharing, per-layer inputs)
on Gemma 3's RoPE per layer type, in a layer of its own, each step as transformers'
``modeling_gemma3n`` computes it.

    streams    the residual stream is A = ``altup_num_inputs`` streams (B, S, A, E): stream 0
               the scaled embedding x₀, stream i > 0 W_i·x₀ rescaled to x₀'s root mean square
    AltUp      each layer (Baykal et al. 2023, "Alternating Updates"):
                 r(x)   = tanh(W_router · Norm(x) / E)                     (A,) per token
                 predict  x̂_i = x_i + Σ_j P(r(x_a))_ij x_j                  P: (A, A) from r
                 the layer runs on the active stream a = ``altup_active_idx`` alone:
                 y = layer(x̂_a)
                 correct  x_i = x̂_i + (1 + C · r(y))_i (y − x̂_a)
    Laurel     a low-rank residual beside the attention (Menghani et al. 2024):
                 n = Norm_in(x̂_a);  h = (x̂_a + Norm(Attn(n)) + n + Norm(W_R W_L n)) / √2
                 y = h + Norm(MLP(Norm(h)))
    sparsity   on the layers ``activation_sparsity_pattern`` gives s > 0 the MLP's gate keeps
               only what passes a Gaussian top-k: g → ReLU(g − mean(g) − std(g)·Φ⁻¹(s))
    PLE        the per-layer input p_n joins after the correction, on the streams 1..A-1:
               x_i += Norm(W_proj · (GELU(W_gate · (c ⊙ x_a)) ⊙ p_n)), c the layer's
               ``correct_output_scale`` (with ``altup_correct_scale``); ids past
               ``vocab_size_per_layer_input`` read row 0
    MLP        its width per layer (``intermediate_size`` may be a list)
    output     streams i > 0 through W'_i, rescaled to stream 0's root mean square, averaged
               over the A streams, then the final norm (``AltUpOutput``)

The taps: ``resid_pre``/``resid_post`` are the A streams (B, Q, A, E); ``attn_out`` is
Norm(Attn(n)) and ``mlp_out`` Norm(MLP(·)), what each sub-layer adds to the active stream
before the √2 and the correction. A head's keys and values on a sharing layer are those of
the layer it reads (stored before the taps of that layer, as Gemma 4's). AltUp's coefficient
clipping (``altup_coef_clip``) acts in training only. The LM head's final logit
soft-capping acts on logits, which we never compute.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn.attention import Mask, MultiHeadAttention, QKTransform
from ..nn.rows import EAGER, RowRequest
from ..nn.taps import tap
from . import llama
from .base import activation
from .fields import given, number, sequence, text, whole
from .gemma import GemmaDecoder, gemma3_rope_parameters
from .gemma4 import RULES as GEMMA4_RULES
from .gemma4 import Gemma4Config, Gemma4Decoder, Gemma4RMSNorm, Shared, kv_sources
from .llama import LlamaConfig, LlamaDecoder, SwiGLU
from .rope import rope_config

MODEL_TYPES = ("gemma3n_text",)
PREFIXES = llama.PREFIXES


@dataclass(frozen=True)
class SoftTokens:
    """One of the wrapper's embedders (``gemma3n``): ids offset..offset+vocab-1, width ``hidden``."""

    offset: int
    vocab: int
    hidden: int
    eps: float


@dataclass(frozen=True)
class Gemma3nConfig(Gemma4Config):
    streams: int = 1  # A
    active: int = 0  # a
    correct_scale: bool = True
    laurel_rank: int = 1
    sparsity: tuple[float, ...] = ()  # per layer; 0: a dense gate
    vision: SoftTokens | None = None  # the wrapper's image soft tokens (None: text alone)
    audio: SoftTokens | None = None  # and its audio soft tokens, from their offset on

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.active < self.streams:
            raise ValueError(f"altup_active_idx={self.active} is not one of the {self.streams} AltUp streams")
        if len(self.sparsity) != self.num_hidden_layers:
            raise ValueError(f"{len(self.sparsity)} activation sparsities for {self.num_hidden_layers} layers")
        v, a = self.vision, self.audio
        if (v is None) != (a is None):
            raise ValueError("gemma3n needs both a vision_config and an audio_config, or neither")
        # Every id from the image offset up must fall in one embedder's table, as transformers
        # looks each up there (an id in a gap would index past a table).
        if v is not None and a is not None and not (v.offset + v.vocab >= a.offset >= v.offset):
            raise ValueError(f"the audio ids (from {a.offset}) do not follow the image ids ({v.offset}+{v.vocab})")
        if a is not None and self.vocab_size > a.offset + a.vocab:
            raise ValueError(f"ids up to {self.vocab_size - 1} pass the audio table ({a.offset}+{a.vocab})")


class SparseGatedMLP(SwiGLU):
    """W_down · (GELU(top_s(W_gate · x)) ⊙ W_up · x); top_s the Gaussian top-k at sparsity s."""

    def __init__(self, hidden: int, inner: int, act: str, sparsity: float) -> None:
        super().__init__(hidden, inner, act)
        self.sparsity = sparsity

    def forward(self, x: Tensor) -> Tensor:
        gate = self.gate(x)  # (B, L, I)
        if self.sparsity > 0.0:
            # Φ⁻¹(s) as torch's Normal(0, 1).icdf computes it, in float32 then the model's dtype.
            s = torch.tensor(self.sparsity, dtype=torch.float32, device=x.device)
            cut = (torch.erfinv(2 * s - 1) * math.sqrt(2)).to(gate.dtype)
            mean, std = gate.mean(-1, keepdim=True), gate.std(-1, keepdim=True, unbiased=False)
            gate = nn.functional.relu(gate - (mean + std * cut))
        return self.down(self.act(gate) * self.up(x))


class AltUp(nn.Module):
    """The predict and correct steps around one layer (stored under transformers' names)."""

    def __init__(self, c: Gemma3nConfig) -> None:
        super().__init__()
        a, e = c.streams, c.hidden_size
        self.correct_output_scale = nn.Parameter(torch.zeros(e))
        self.correction_coefs = nn.Linear(a, a, bias=False)
        self.prediction_coefs = nn.Linear(a, a * a, bias=False)
        self.modality_router = nn.Linear(e, a, bias=False)
        self.router_norm = Gemma4RMSNorm(e, c.rms_norm_eps)
        self.active = c.active

    def route(self, x: Tensor) -> Tensor:
        """r(x) (B, L, A) for one stream x (B, L, E)."""
        scale = torch.tensor(x.size(-1) ** -1.0).to(x.dtype)  # 1/E, rounded as transformers' buffer
        return torch.tanh(self.modality_router(self.router_norm(x) * scale).float()).type_as(x)

    def predict(self, streams: Tensor) -> Tensor:
        """x̂ (B, L, A, E) from the streams x (B, L, A, E)."""
        r = self.route(streams[:, :, self.active])  # (B, L, A)
        a = streams.size(2)
        coefs = self.prediction_coefs(r).reshape(*r.shape[:-1], a, a)  # (B, L, A, A): P_ij
        # x̂_iᵀ = Σ_j x_jᵀ P_ij, as transformers multiplies (E, A) · (A, A) per token.
        mixed = torch.matmul(streams.transpose(-1, -2), coefs.transpose(-1, -2)).transpose(-1, -2)  # (B, L, A, E)
        return (mixed + streams).contiguous().type_as(streams)

    def correct(self, predictions: Tensor, activated: Tensor) -> Tensor:
        """x (B, L, A, E) from the predictions x̂ (B, L, A, E) and the layer's output y (B, L, E)."""
        r = self.route(activated)  # (B, L, A)
        innovation = (activated - predictions[:, :, self.active])[:, :, None]  # (B, L, 1, E)
        coefs = (self.correction_coefs(r) + 1.0)[..., None]  # (B, L, A, 1)
        return (innovation * coefs + predictions).contiguous().type_as(activated)

    def scale(self, x: Tensor) -> Tensor:
        return (x.type_as(self.correct_output_scale) * self.correct_output_scale).type_as(x)


class Laurel(nn.Module):
    """Learned augmented residual: x + Norm(W_R · W_L · x), W_L of rank ``laurel_rank``."""

    def __init__(self, c: Gemma3nConfig) -> None:
        super().__init__()
        self.linear_left = nn.Linear(c.hidden_size, c.laurel_rank, bias=False)
        self.linear_right = nn.Linear(c.laurel_rank, c.hidden_size, bias=False)
        self.post_laurel_norm = Gemma4RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.post_laurel_norm(self.linear_right(self.linear_left(x)))


class Gemma3nBlock(nn.Module):
    """One layer on the A streams (B, L, A, E): predict, the layer on the active stream, correct."""

    shared: Shared

    def __init__(self, c: Gemma3nConfig, layer: int, attn: MultiHeadAttention, shared: Shared) -> None:
        super().__init__()
        e, eps = c.hidden_size, c.rms_norm_eps
        norm = lambda: Gemma4RMSNorm(e, eps)  # noqa: E731
        self.altup, self.laurel = AltUp(c), Laurel(c)
        self.attn_norm, self.attn, self.post_attn_norm = norm(), attn, norm()
        self.mlp_norm, self.post_mlp_norm = norm(), norm()
        self.mlp = SparseGatedMLP(e, c.inner_sizes[layer], c.hidden_act, c.sparsity[layer])
        self.ple_gate = nn.Linear(e, c.ple_size, bias=False)
        self.ple_proj = nn.Linear(c.ple_size, e, bias=False)
        self.ple_norm = norm()
        self.act = activation(c.hidden_act)
        self.layer, self.shared, self.active, self.correct_scale = layer, shared, c.active, c.correct_scale

    def forward(
        self, x: Tensor, mask: Mask, qk_transform: QKTransform | None = None, request: RowRequest = EAGER
    ) -> tuple[Tensor, Tensor]:
        # 1. AltUp's prediction; the layer reads the active stream alone.
        predictions = self.altup.predict(x)  # (B, L, A, E)
        active = predictions[:, :, self.active]  # (B, L, E)
        normed = self.attn_norm(active)
        # 2. Attention and Laurel side by side on the normed stream, averaged in by 1/√2.
        a, weights = self.attn(normed, mask=mask, qk_transform=qk_transform, request=request)
        h = (active + tap("attn_out", self.post_attn_norm(a)) + self.laurel(normed)) / math.sqrt(2)
        # 3. The MLP.
        y = h + tap("mlp_out", self.post_mlp_norm(self.mlp(self.mlp_norm(h))))  # (B, L, E)
        # 4. AltUp's correction spreads y over every stream.
        corrected = self.altup.correct(predictions, y)  # (B, L, A, E)
        # 5. The per-layer input, gated by the corrected active stream, joins streams 1..A-1.
        first = corrected[:, :, self.active]
        if self.correct_scale:
            first = self.altup.scale(first)
        p = self.shared.ple[:, -x.size(1) :, self.layer]  # type: ignore[index]  # (B, L, P): this step's rows
        first = self.ple_norm(self.ple_proj(self.act(self.ple_gate(first)) * p))
        # (Out of place: ``first`` is a view of ``corrected`` that autograd may have saved.)
        joined = torch.cat((corrected[:, :, :1], corrected[:, :, 1:] + first[:, :, None]), dim=2)  # (B, L, A, E)
        return joined, weights


def _to_rms(x: Tensor, target: Tensor) -> Tensor:
    """x (B, L, E) rescaled to the root mean square ``target`` (B, L, 1) per token."""
    rms = torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True).clamp(min=1e-5))
    return x * target / rms


class AltUpOutput(nn.Module):
    """The stack's end: the A streams (B, L, A, E) to one (B, L, E), then the final norm."""

    def __init__(self, c: Gemma3nConfig) -> None:
        super().__init__()
        e = c.hidden_size
        self.unembed = nn.ModuleList(nn.Linear(e, e, bias=False) for _ in range(1, c.streams))
        self.norm = Gemma4RMSNorm(e, c.rms_norm_eps)

    def forward(self, streams: Tensor) -> Tensor:
        first = streams[:, :, 0]  # (B, L, E)
        target = torch.mean(first**2, dim=-1, keepdim=True) ** 0.5
        each = [first] + [_to_rms(proj(streams[:, :, i + 1]), target) for i, proj in enumerate(self.unembed)]
        return self.norm(torch.mean(torch.stack(each), dim=0))


class SoftTokenEmbedder(nn.Module):
    """The wrapper's embedding of its ids offset.. (image or audio soft tokens written in the
    text): Norm'(W · Norm(T[id − offset])), Norm' without weight (transformers' names)."""

    def __init__(self, soft: SoftTokens, e: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(soft.vocab, soft.hidden)
        self.hard_embedding_norm = Gemma4RMSNorm(soft.hidden, soft.eps)
        self.embedding_projection = nn.Linear(soft.hidden, e, bias=False)
        self.post_norm = Gemma4RMSNorm(e, soft.eps, with_scale=False)
        self.offset, self.last = soft.offset, soft.offset + soft.vocab - 1

    def forward(self, input_ids: Tensor, chosen: Tensor, x: Tensor) -> Tensor:
        """x (B, S, E) with the ``chosen`` (B, S) positions' embeddings replaced by this one's."""
        ids = torch.where(chosen, input_ids, self.last) - self.offset  # the others: any row, unused
        h = self.post_norm(self.embedding_projection(self.hard_embedding_norm(self.embedding(ids))))
        return torch.where(chosen[..., None], h.to(x.dtype), x)


class Gemma3nDecoder(Gemma4Decoder):
    config: Gemma3nConfig
    factors_in_dtype = True

    def __init__(self, c: Gemma3nConfig) -> None:
        super().__init__(c)
        e = c.hidden_size
        self.altup_projections = nn.ModuleList(nn.Linear(e, e, bias=False) for _ in range(1, c.streams))
        self.final_norm = AltUpOutput(c)
        if c.vision is not None and c.audio is not None:
            self.embed_vision, self.embed_audio = SoftTokenEmbedder(c.vision, e), SoftTokenEmbedder(c.audio, e)

    def make_block(self, layer: int) -> nn.Module:
        return Gemma3nBlock(self.config, layer, self.make_attention(layer), self.shared)

    def embed(self, input_ids: Tensor) -> Tensor:
        """(B, S, A, E): the A streams entering layer 0."""
        c = self.config
        x = GemmaDecoder.embed(self, input_ids)  # (B, S, E), scaled by √E
        if c.vision is not None and c.audio is not None:  # the wrapper: soft-token ids written in the text
            x = self.embed_vision(input_ids, (input_ids >= c.vision.offset) & (input_ids < c.audio.offset), x)
            x = self.embed_audio(input_ids, input_ids >= c.audio.offset, x)
        self.shared.kv = {}
        # Ids the per-layer table lacks read its row 0, as transformers' lookup does.
        known = (input_ids >= 0) & (input_ids < c.ple_vocab)
        self.shared.ple = self.per_layer_inputs(torch.where(known, input_ids, 0), x)  # (B, S, N, P)
        target = torch.mean(x**2, dim=-1, keepdim=True) ** 0.5  # (B, S, 1)
        streams = [x] + [_to_rms(proj(x).to(x.dtype), target) for proj in self.altup_projections]
        return torch.stack(streams, dim=2)  # (B, S, A, E)

    def qk_transforms(self, input_ids: Tensor, x: Tensor) -> Sequence[QKTransform | None]:
        return LlamaDecoder.qk_transforms(self, input_ids, x)  # Gemma 3's RoPE per layer type


def _sparsities(config: dict[str, Any], layers: int) -> tuple[float, ...]:
    """``activation_sparsity_pattern`` per layer; absent, transformers' default: 0.95 on the
    first 10 layers of a model with more than 10, else 0."""
    key = "activation_sparsity_pattern"
    value = config.get(key)
    if value is None:
        value = [0.95] * 10 + [0.0] * (layers - 10) if layers > 10 else [0.0] * layers
    values = value if isinstance(value, list) else [value] * layers
    if len(values) != layers:
        raise ValueError(f"{key} lists {len(values)} values for {layers} layers")
    # Below 1: Φ⁻¹(1) is infinite and every activation would be cut.
    return tuple(number({key: v}, key, 0.0, low=0.0, high=math.nextafter(1.0, 0.0)) for v in values)


def build(config: dict[str, Any]) -> Gemma3nDecoder:
    return Gemma3nDecoder(read_config(config))


def read_config(config: dict[str, Any]) -> Gemma3nConfig:
    """``gemma3n_text``'s config.json, read as transformers 5 fills it in."""
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    head_dim = whole(config, "head_dim", int(config["hidden_size"]) // heads)
    default_types = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(layers)]
    types = tuple(sequence(config, "layer_types", default_types))
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UnsupportedArchitectureError(
            "gemma3n_text needs layer_types of sliding_attention/full_attention, one per layer",
            setting="layer_types",
        )
    shared = whole(config, "num_kv_shared_layers", 0, low=0)
    if shared >= layers:
        raise ValueError(f"num_kv_shared_layers is {shared}; it must be below num_hidden_layers ({layers})")
    source = kv_sources(types, shared)
    inner = config.get("intermediate_size")
    sizes = inner if isinstance(inner, list) else [inner] * layers
    if len(sizes) != layers:
        raise ValueError(f"intermediate_size lists {len(sizes)} sizes for {layers} layers")
    inner_sizes = tuple(whole({"intermediate_size": n}, "intermediate_size", None) for n in sizes)
    per_type = {**config, "rope_parameters": gemma3_rope_parameters(config)}
    window = whole(config, "sliding_window", 512)
    fields: dict[str, Any] = {
        "hidden_act": text(config, "hidden_activation", "gelu_pytorch_tanh"),
        "scale": 1.0,
        "head_dim": head_dim,
        "windows": tuple(window if kind == "sliding_attention" else None for kind in types),
        "ropes": tuple(rope_config(per_type, head_dim, layer_type=kind) for kind in types),
    }
    # (The dense field holds layer 0's width; the blocks read ``inner_sizes``.)
    base = LlamaConfig.from_dict({**config, "intermediate_size": inner_sizes[0]}, **fields)
    streams = whole(config, "altup_num_inputs", 4)
    return Gemma3nConfig(
        **{**vars(base), "generation": 3},
        head_dims=(head_dim,) * layers,
        kv_heads=(base.num_key_value_heads,) * layers,
        keys_as_values=(False,) * layers,
        kv_source=source,
        layer_types=types,
        inner_sizes=inner_sizes,
        ple_size=whole(config, "hidden_size_per_layer_input", 256),
        ple_vocab=whole(config, "vocab_size_per_layer_input", 262_144),
        streams=streams,
        active=whole(config, "altup_active_idx", 0, low=0),
        correct_scale=bool(given(config, "altup_correct_scale", True)),
        laurel_rank=whole(config, "laurel_rank", 64),
        sparsity=_sparsities(config, layers),
    )


def build_wrapped(text: dict[str, Any], wrapper: dict[str, Any]) -> Gemma3nDecoder:
    """The ``gemma3n`` wrapper on text (wrapped.py): its language model, with the embedders
    of the image and audio soft-token ids from its ``vision_config`` and ``audio_config``
    (transformers' defaults where a key is absent)."""

    def soft(key: str, offset: int, hidden: int) -> SoftTokens:
        sub = dict(given(wrapper, key, {}))
        return SoftTokens(
            whole(sub, "vocab_offset", offset),
            whole(sub, "vocab_size", 128),
            whole(sub, "hidden_size", hidden),
            number(sub, "rms_norm_eps", 1e-6, above=0.0),
        )

    vision, audio = soft("vision_config", 262_144, 2048), soft("audio_config", 262_272, 1536)
    return Gemma3nDecoder(dataclasses.replace(read_config(text), vision=vision, audio=audio))


_L = r"layers\.(\d+)\."
RULES = (
    *(rule for rule in GEMMA4_RULES if rule[0] != r"norm\.weight"),  # the final norm is AltUpOutput's
    (r"altup_projections\.(\d+)\.weight", r"altup_projections.\1.weight"),
    (r"altup_unembed_projections\.(\d+)\.weight", r"final_norm.unembed.\1.weight"),
    (r"norm\.weight", r"final_norm.norm.weight"),
    (_L + r"altup\.(correct_output_scale|correction_coefs\.weight|prediction_coefs\.weight)", r"blocks.\1.altup.\2"),
    (_L + r"altup\.(modality_router|router_norm)\.weight", r"blocks.\1.altup.\2.weight"),
    (_L + r"laurel\.(linear_left|linear_right|post_laurel_norm)\.weight", r"blocks.\1.laurel.\2.weight"),
)
# The wrapper's embedders (``gemma3n``), outside its language model's prefix (wrapped.py).
WRAPPER_RULES = (
    (
        r"(?:model\.)?embed_(vision|audio)\.(embedding|hard_embedding_norm|embedding_projection)\.weight",
        r"embed_\1.\2.weight",
    ),
)
