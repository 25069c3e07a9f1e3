"""DeBERTa-v2 and DeBERTa-v3 (``model_type`` "deberta-v2"): BERT's post-norm encoder with
disentangled attention.

Each token has a content vector; relative positions have their own embeddings P (one
row per relative-position bucket, shared by every layer). The score of query i and key
j sums up to three terms, all divided by √(D · (1 + number of position terms)):

    c2c   content → content     q_i · k_j
    c2p   content → position    q_i · Pk[δ(i, j)]       Pk = P · W_pos_key   (or W^K with share_att_key)
    p2c   position → content    k_j · Pq[δ(i, j)]       Pq = P · W_pos_query (or W^Q with share_att_key)

where δ(i, j) = clamp(bucket(i - j) + span, 0, 2·span - 1): exact distances below
``position_buckets / 2``, log-spaced beyond up to ``max_relative_positions`` (v3:
256 buckets), or plain i - j clamped to ±span without buckets. ``pos_att_type``
says which position terms the checkpoint was trained with; ``relative_attention``
false drops them. P is LayerNormed first with ``norm_rel_ebd: "layer_norm"``.

Embeddings: tokens (+ absolute positions when ``position_biased_input``; v3 has none)
(+ token types), an optional projection up from ``embedding_size``, LayerNorm, then
padded positions zeroed. DeBERTa-v2 xlarge/xxlarge add a convolution beside layer 0
(``conv_kernel_size``): x_1 = LayerNorm(layer_0(x) + act(conv(x))), padding zeroed.

The disentangled terms need q and k inside the attention, so this family computes its
per-head q, k, v itself and hands the sum of the position terms to
``attention.softmax_attention`` as its additive bias. torch only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedArchitectureError
from ..nn import taps
from ..nn.attention import MultiHeadAttention, padding_mask, softmax_attention
from ..nn.taps import tap
from .base import AttnModel, ForwardOutput, activation, config_value, layer_loop
from .fields import given, whole

MODEL_TYPES = ("deberta-v2",)
PREFIXES = ("deberta.",)


@dataclass(frozen=True)
class DebertaConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-7
    type_vocab_size: int = 0
    embedding_size: int | None = None
    position_biased_input: bool = True
    relative_attention: bool = False
    pos_att_type: tuple[str, ...] = ()
    position_buckets: int = -1
    max_relative_positions: int = -1
    share_att_key: bool = False
    norm_rel_ebd: bool = False
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        unknown = sorted(set(self.pos_att_type) - {"c2p", "p2c"})
        if unknown:
            raise UnsupportedArchitectureError(
                f"pos_att_type {unknown} is not implemented by the own engine (c2p and p2c are)"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def span(self) -> int:
        """Relative positions run over -span..span-1 (2·span rows of P)."""
        if self.position_buckets > 0:
            return self.position_buckets
        return self.max_relative_positions if self.max_relative_positions > 0 else self.max_position_embeddings

    @property
    def max_distance(self) -> int:
        return self.max_relative_positions if self.max_relative_positions > 0 else self.max_position_embeddings

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> DebertaConfig:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        head_size = config.get("attention_head_size")
        if head_size is not None and int(head_size) != hidden // heads:
            raise UnsupportedArchitectureError(
                f"attention_head_size={head_size} (not hidden_size / num_attention_heads) is not implemented "
                "by the own engine"
            )
        types = given(config, "pos_att_type", ())  # "" and [] name no terms, as () does
        if isinstance(types, str):
            types = [t.strip() for t in types.lower().split("|") if t.strip()]
        norm_rel = [x.strip() for x in str(config.get("norm_rel_ebd", "none")).lower().split("|")]
        embedding = None if config.get("embedding_size") is None else whole(config, "embedding_size", None)
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            intermediate_size=int(config["intermediate_size"]),
            max_position_embeddings=int(config_value(config, "max_position_embeddings", default=512)),
            hidden_act=str(config_value(config, "hidden_act", default="gelu")),
            layer_norm_eps=float(config_value(config, "layer_norm_eps", default=1e-7)),
            type_vocab_size=int(config_value(config, "type_vocab_size", default=0)),
            embedding_size=None if embedding is None or embedding == hidden else embedding,
            position_biased_input=bool(config.get("position_biased_input", True)),
            relative_attention=bool(config.get("relative_attention", False)),
            pos_att_type=tuple(types),
            position_buckets=int(config_value(config, "position_buckets", default=-1)),
            max_relative_positions=int(config_value(config, "max_relative_positions", default=-1)),
            share_att_key=bool(config.get("share_att_key", False)),
            norm_rel_ebd="layer_norm" in norm_rel,
            conv_kernel_size=int(config_value(config, "conv_kernel_size", default=0)),
            conv_groups=int(config_value(config, "conv_groups", default=1)),
            conv_act=str(config_value(config, "conv_act", default="tanh")),
        )


def score_terms(config: dict[str, Any]) -> tuple[str, ...]:
    """Which terms a DeBERTa checkpoint's attention scores sum: ("c2c", "c2p", "p2c") or fewer."""
    # Read leniently (no validation): the hf engine states the terms of any checkpoint.
    types = given(config, "pos_att_type", ())
    if isinstance(types, str):
        types = [t.strip() for t in types.lower().split("|")]
    position = tuple(t for t in ("c2p", "p2c") if t in types) if config.get("relative_attention") else ()
    return ("c2c", *position)


def log_bucket_position(relative: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """DeBERTa's buckets of signed distances: exact within ±bucket_size/2, then
    log-spaced up to ``max_position``, the sign kept (same ops as transformers)."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    # Distances inside ±mid are kept as they are; mid - 1 only keeps the log finite there.
    inside = (relative < mid) & (relative > -mid)
    magnitude = torch.where(inside, torch.tensor(mid - 1).type_as(relative), torch.abs(relative))
    log_pos = (
        torch.ceil(torch.log(magnitude / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    )
    return torch.where(magnitude <= mid, relative.type_as(log_pos), log_pos * sign)


def relative_positions(length: int, c: DebertaConfig, device: torch.device) -> Tensor:
    """(L, L) long: bucket(i - j) for query i and key j."""
    ids = torch.arange(length, dtype=torch.long, device=device)
    relative = ids[:, None] - ids[None, :]  # (L, L): query - key
    if c.position_buckets > 0 and c.max_distance > 0:
        relative = log_bucket_position(relative, c.position_buckets, c.max_distance)
    return relative.long()


class DisentangledAttention(MultiHeadAttention):
    """Multi-head attention whose scores add DeBERTa's content↔position terms.

    Same projections as ``MultiHeadAttention`` (q_proj, k_proj, v_proj, o_proj), plus
    ``pos_key_proj`` (c2p) and ``pos_query_proj`` (p2c) unless ``share_att_key``.
    """

    def __init__(self, c: DebertaConfig) -> None:
        super().__init__(c.hidden_size, c.num_attention_heads)
        self.terms = tuple(t for t in ("c2p", "p2c") if t in c.pos_att_type)
        self.relative = c.relative_attention
        self.span = c.span
        self.share_att_key = c.share_att_key
        if self.relative and not c.share_att_key:
            if "c2p" in self.terms:
                self.pos_key_proj = nn.Linear(c.hidden_size, c.hidden_size)
            if "p2c" in self.terms:
                self.pos_query_proj = nn.Linear(c.hidden_size, c.hidden_size)
        # √(D · (1 + number of position terms)), a float32 tensor as transformers makes it.
        # (Built on the CPU: the model itself is built on the meta device.)
        factor = torch.tensor(c.head_dim, dtype=torch.float, device="cpu") * (1 + len(self.terms))
        self.score_scale = float(torch.sqrt(factor))

    def forward_disentangled(
        self,
        x: Tensor,
        mask: Tensor | None,
        positions: Tensor | None,
        rel: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        """x (B, L, E); positions (L, L) bucketed i - j; rel (2·span, E) the position
        embeddings P. Returns output (B, L, E) and weights (B, H, L, L)."""
        b, length, _ = x.shape
        # 1. Per-head projections.
        q = self._split(self.q_proj(x), self.n_heads)  # (B, H, L, D)
        k = self._split(self.k_proj(x), self.n_heads)  # (B, H, L, D)
        v = self._split(self.v_proj(x), self.n_heads)  # (B, H, L, D)
        scale = torch.tensor(self.score_scale, dtype=q.dtype, device=q.device)
        # 2. The position terms, one (B, H, L, L) bias.
        bias: Tensor | None = None
        if self.relative and self.terms and positions is not None and rel is not None:
            index = torch.clamp(positions + self.span, 0, 2 * self.span - 1)  # (L, L): δ(i, j)
            index = index.expand(b, self.n_heads, length, length)  # (B, H, L, L)
            bias = torch.zeros((), dtype=q.dtype, device=q.device)
            if "c2p" in self.terms:
                pos_key = self.k_proj(rel) if self.share_att_key else self.pos_key_proj(rel)  # (2·span, E)
                pk = pos_key.view(-1, self.n_heads, self.head_dim).transpose(0, 1)  # (H, 2·span, D)
                # c2p[i, j] = q_i · Pk[δ(i, j)]
                c2p = torch.gather(q @ pk.transpose(-1, -2), -1, index)  # (B, H, L, L)
                bias = bias + c2p / scale
            if "p2c" in self.terms:
                pos_query = self.q_proj(rel) if self.share_att_key else self.pos_query_proj(rel)  # (2·span, E)
                pq = pos_query.view(-1, self.n_heads, self.head_dim).transpose(0, 1)  # (H, 2·span, D)
                # p2c[i, j] = k_j · Pq[δ(i, j)]: gathered over key rows, then transposed.
                flipped = torch.clamp(-positions + self.span, 0, 2 * self.span - 1)  # (L, L)
                gathered = torch.gather(k @ pq.transpose(-1, -2), -1, flipped.expand(b, self.n_heads, length, length))
                bias = bias + gathered.transpose(-1, -2) / scale  # (B, H, L, L)
        site = taps.active()  # None unless a pass attached taps (nn/taps.py)
        if site is not None:
            q, k, v = site("attn.q", q), site("attn.k", k), site("attn.v", v)
        # 3. softmax(q·(k/scale)ᵀ + bias)·v: k is divided first, as transformers does, so
        #    the scores round alike.
        heads, weights = softmax_attention(q, k / scale, v, mask, 1.0, score_bias=bias)  # (B, H, L, D), (B, H, L, L)
        z = heads.transpose(1, 2)  # (B, L, H, D)
        if site is not None:
            weights, z = site("attn.pattern", weights), site("attn.z", z)
        concat = z.reshape(z.size(0), length, self.n_heads * self.head_dim)  # (B, L, H·D)
        out = self.o_proj(concat)  # (B, L, E)
        return (out if site is None else site("attn.out", out)), weights


class Block(nn.Module):
    """One post-LayerNorm layer with disentangled attention."""

    def __init__(self, c: DebertaConfig) -> None:
        super().__init__()
        self.attn = DisentangledAttention(c)
        self.attn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(c.hidden_size, c.intermediate_size)
        self.ffn_out = nn.Linear(c.intermediate_size, c.hidden_size)
        self.ffn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.act = activation(c.hidden_act)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        positions: Tensor | None,
        rel: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        a, weights = self.attn.forward_disentangled(x, mask, positions, rel)  # (B, S, E), (B, H, S, S)
        x = self.attn_norm(tap("attn_out", a) + x)
        x = self.ffn_norm(tap("mlp_out", self.ffn_out(self.act(self.ffn_in(x)))) + x)
        return x, weights


class Conv(nn.Module):
    """DeBERTa-v2's convolution beside layer 0 (``conv_kernel_size`` > 0)."""

    def __init__(self, c: DebertaConfig) -> None:
        super().__init__()
        k = c.conv_kernel_size
        self.conv = nn.Conv1d(c.hidden_size, c.hidden_size, k, padding=(k - 1) // 2, groups=c.conv_groups)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.act = activation(c.conv_act) if c.conv_act != "tanh" else torch.tanh

    def forward(self, x: Tensor, residual: Tensor, real: Tensor) -> Tensor:
        """x (B, S, E) the layer's input, residual its output, real (B, S) 1/0."""
        out = self.conv(x.permute(0, 2, 1).contiguous()).permute(0, 2, 1).contiguous()  # (B, S, E)
        out = out.masked_fill(~real.bool()[..., None], 0)
        out = self.norm(residual + self.act(out))
        return out * real[..., None].to(out.dtype)


class Deberta(AttnModel):
    def __init__(self, c: DebertaConfig) -> None:
        super().__init__()
        self.config = c
        self.num_layers = c.num_hidden_layers
        self.num_heads = self.num_kv_heads = c.num_attention_heads
        self.causal = False
        self.max_positions = c.max_position_embeddings if c.position_biased_input else None
        self.type_vocab_size = c.type_vocab_size
        width = c.hidden_size if c.embedding_size is None else c.embedding_size
        self.tokens = nn.Embedding(c.vocab_size, width)
        self.positions = nn.Embedding(c.max_position_embeddings, width) if c.position_biased_input else None
        self.token_types = nn.Embedding(c.type_vocab_size, width) if c.type_vocab_size > 0 else None
        self.project = nn.Linear(width, c.hidden_size, bias=False) if c.embedding_size is not None else None
        self.embed_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.num_hidden_layers))
        self.rel = nn.Embedding(2 * c.span, c.hidden_size) if c.relative_attention else None
        self.rel_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps) if c.norm_rel_ebd else None
        self.conv = Conv(c) if c.conv_kernel_size > 0 else None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_layer: int | None = None,
        token_type_ids: Tensor | None = None,
        *,
        layers: Collection[int] | None = None,
        queries: Sequence[int] | None = None,
        fused: bool = False,
    ) -> ForwardOutput:
        """input_ids (B, S), attention_mask (B, S) of 1/0, token_type_ids (B, S) for pairs.

        The disentangled scores need the eager path: every layer's weights are computed
        in full and only the rows of ``queries`` kept (``fused`` is ignored)."""
        real = torch.ones_like(input_ids) if attention_mask is None else attention_mask  # (B, S)
        length = input_ids.size(1)
        # 1. Embeddings, in transformers' order: tokens + positions + types, project, norm, zero padding.
        x = self.tokens(input_ids)  # (B, S, E_emb)
        if self.positions is not None:
            x = x + self.positions(torch.arange(length, device=input_ids.device))
        if self.token_types is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x = x + self.token_types(types)
        if self.project is not None:
            x = self.project(x)  # (B, S, E)
        x = self.embed_norm(x) * real[..., None].to(x.dtype)
        # 2. Relative positions and their (normed) embeddings, shared by every layer.
        positions = relative_positions(length, self.config, input_ids.device) if self.rel is not None else None
        rel = None
        if self.rel is not None:
            rel = self.rel.weight if self.rel_norm is None else self.rel_norm(self.rel.weight)  # (2·span, E)
        mask = padding_mask(real)  # (B, 1, 1, S)
        # 3. The layers (and the convolution beside layer 0).
        last = self.num_layers - 1 if max_layer is None else max_layer

        def layer(n: int, x: Tensor) -> tuple[Tensor, Tensor]:
            out, weights = self.blocks[n](x, mask, positions, rel)
            if n == 0 and self.conv is not None:
                out = self.conv(x, out, real)
            return out, weights if queries is None else weights[:, :, list(queries)]  # (B, H, R, S)

        x, attentions = layer_loop(x, last + 1, layer)
        return ForwardOutput(hidden_states=x, attentions=attentions)


def build(config: dict[str, Any]) -> Deberta:
    return Deberta(DebertaConfig.from_dict(config))


_LAYER = r"encoder\.layer\.(\d+)\."

RULES = (
    (r"embeddings\.word_embeddings\.weight", r"tokens.weight"),
    (r"embeddings\.position_embeddings\.weight", r"positions.weight"),
    (r"embeddings\.token_type_embeddings\.weight", r"token_types.weight"),
    (r"embeddings\.embed_proj\.weight", r"project.weight"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"embed_norm.\1"),
    (_LAYER + r"attention\.self\.(query|key|value)_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),
    (_LAYER + r"attention\.self\.pos_key_proj\.(weight|bias)", r"blocks.\1.attn.pos_key_proj.\2"),
    (_LAYER + r"attention\.self\.pos_query_proj\.(weight|bias)", r"blocks.\1.attn.pos_query_proj.\2"),
    (_LAYER + r"attention\.output\.dense\.(weight|bias)", r"blocks.\1.attn.o_proj.\2"),
    (_LAYER + r"attention\.output\.LayerNorm\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (_LAYER + r"intermediate\.dense\.(weight|bias)", r"blocks.\1.ffn_in.\2"),
    (_LAYER + r"output\.dense\.(weight|bias)", r"blocks.\1.ffn_out.\2"),
    (_LAYER + r"output\.LayerNorm\.(weight|bias)", r"blocks.\1.ffn_norm.\2"),
    (r"encoder\.rel_embeddings\.weight", r"rel.weight"),
    (r"encoder\.LayerNorm\.(weight|bias)", r"rel_norm.\1"),
    (r"encoder\.conv\.conv\.(weight|bias)", r"conv.conv.\1"),
    (r"encoder\.conv\.LayerNorm\.(weight|bias)", r"conv.norm.\1"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """query/key/value -> q/k/v: our projections' names."""
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        for long, short in (("query_proj", "q_proj"), ("key_proj", "k_proj"), ("value_proj", "v_proj")):
            if f".attn.{long}." in name:
                name = name.replace(f".attn.{long}.", f".attn.{short}.")
        out[name] = tensor
    return out
