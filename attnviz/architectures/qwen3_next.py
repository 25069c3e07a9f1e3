"""Qwen3-Next: a hybrid stack, three Gated DeltaNet (linear attention) layers to each
gated softmax attention layer, over Qwen2-MoE's router with its shared expert.

Softmax attention layers (``layer_types`` "full_attention"; every fourth by default):

    q, gate  = x·W^Q, x·W^G            q_proj gives each head [q_h | gate_h] side by side;
                                       convert() splits it into our q_proj and gate_proj
    q_h, k_g = Norm(q_h), Norm(k_g)    per-head RMSNorm over D with Gemma's (1 + w)
    RoPE     on the first ``partial_rotary_factor``·D dims (0.25 by default), by halves
    out      = W^O · (Concat(head_1, ..., head_H) ⊙ σ(gate))   the output gate: each head's
                                       output scaled by a gate of its query's input, after
                                       the softmax (``MultiHeadAttention.gate_output``)

A head's weights are an ordinary softmax over the keys, shown as any other; but since the
gate multiplies the mixed values by a function of the query, a key's part of the output
α_hij · (σ(gate_hi) ⊙ v_hj)·W_h^O has no norm of the key alone: the norm measure and
explain refuse these layers (``MultiHeadAttention.output_gated``).

Gated DeltaNet layers (Yang, Kautz and Hatamizadeh 2025; "linear_attention") have no
attention weights; they are computed exactly so that the hidden states reaching the next
softmax layer are transformers'. Per value head, with state S (d_k × d_v), in float32:

    q, k, v   = SiLU(causal depthwise conv(x·[W^Q | W^K | W^V]))     (kernel
                ``linear_conv_kernel_dim``); q, k L2-normed, q · d_k^(-1/2); query/key
                heads shared by Hv/Hk value heads
    β_t       = σ(x_t·W^b),   g_t = -exp(A_log) · softplus(x_t·W^a + dt_bias)
    S_t       = exp(g_t) · S_{t-1}
    S_t       = S_t + k_t ⊗ β_t·(v_t - S_tᵀ·k_t)                    (the delta rule)
    o_t       = S_tᵀ·q_t
    out       = W^out · (RMSNorm(o_t) · w ⊙ SiLU(x_t·W^z))          per value head

``gated_delta_rule`` writes the recurrence token by token, the readable reference;
``chunked_gated_delta_rule`` computes it as transformers does, by chunks of 64 tokens in
the same float operations (its torch fallback), which is what runs. The tests hold the
two to each other and the chunks to transformers (tests/test_families_2026.py).

Views list the softmax layers alone, by their model layer numbers (the hybrid layer
loop of hybrid.py, ``ModelShape.attention_layers``).

Qwen3.5 (``qwen3_5_text``, ``qwen3_5_moe_text``: the text stacks) is the same hybrid with
the Gated DeltaNet's projections apart (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
``in_proj_a``, each head after head, where Qwen3-Next groups them per key head); dense
SwiGLU MLPs in every layer (``qwen3_5_text``) or the routed and shared experts in every
layer with the top-k always renormalised (``qwen3_5_moe_text``). Its multimodal RoPE gives
text tokens one position on every axis, which is plain RoPE. torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from ..nn.taps import tap
from .base import activation
from .decoder import PreNormBlock
from .fields import fraction, given, sequence, whole
from .gemma import GemmaRMSNorm
from .hybrid import HybridDecoder
from .llama import LlamaConfig, SwiGLU, attention_options
from .moe import SparseMoE
from .moe import convert as moe_convert
from .qwen2_moe import SharedExpertMoE
from .qwen3 import QKNormAttention
from .rope import rope_config

MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
PREFIXES = ("model.",)


@dataclass(frozen=True)
class Qwen3NextConfig(LlamaConfig):
    layer_types: tuple[str, ...] = ()  # per layer: "full_attention" or "linear_attention"
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 1
    linear_key_head_dim: int = 1
    linear_value_head_dim: int = 1
    linear_conv_kernel_dim: int = 4
    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    shared_expert_intermediate_size: int = 1
    norm_topk_prob: bool = True
    sparse_layers: tuple[int, ...] = ()
    # The Gated DeltaNet's projections: "grouped" per key head (Qwen3-Next), "split" (Qwen3.5).
    projections: str = "grouped"

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types names {len(self.layer_types)} layers, not {self.num_hidden_layers}")
        unknown = sorted(set(self.layer_types) - {"full_attention", "linear_attention"})
        if unknown:
            raise ValueError(f"layer_types {unknown} are neither full_attention nor linear_attention")
        if self.projections not in ("grouped", "split"):
            raise ValueError(f"unknown Gated DeltaNet projections {self.projections!r}")
        if "full_attention" not in self.layer_types:
            raise ValueError("no full_attention layer: nothing has attention weights to show")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )


class GatedAttention(QKNormAttention):
    """Qwen3-Next's softmax attention: q/k norms, and each head's output times σ(gate)."""

    output_gated = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        d_model, width = self.q_proj.in_features, self.n_heads * self.head_dim
        self.gate_proj = nn.Linear(d_model, width, bias=self.q_proj.bias is not None)  # W^G: one gate a head dim

    def gate_output(self, z: Tensor, query: Tensor) -> Tensor:
        b, length, h, d = z.shape
        return z * torch.sigmoid(self.gate_proj(query)).view(b, length, h, d)  # (B, L, H, D)


class GatedRMSNorm(nn.Module):
    """RMSNorm(x)·w ⊙ SiLU(z), per value head (Llama's w, cast back before the gate)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(x.dtype)
        return (h * nn.functional.silu(z.float())).to(x.dtype)


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / √(Σx² + eps) over the last dim (the FLA library's, as transformers writes it)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> Tensor:
    """The gated delta rule, token by token, in float32.

    Args:
        q, k: (B, T, Hv, dk), already shared out to the value heads and L2-normed; q scaled.
        v: (B, T, Hv, dv).
        g: (B, T, Hv) log decay (≤ 0); beta: (B, T, Hv) write strength in (0, 1).

    Returns:
        (B, T, Hv, dv) float32: o_t = S_tᵀ·q_t.
    """
    b, t, h, dk = k.shape
    dv = v.size(-1)
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    state = q.new_zeros(b, h, dk, dv)  # S: (B, Hv, dk, dv)
    out = q.new_empty(b, t, h, dv)
    for step in range(t):
        q_t, k_t, v_t = q[:, step], k[:, step], v[:, step]  # (B, Hv, dk), (B, Hv, dk), (B, Hv, dv)
        # 1. Forget: the state decays by exp(g_t).
        state = state * g[:, step].exp()[..., None, None]
        # 2. Write: what the state already says for k_t is replaced by v_t, at strength β_t.
        remembered = (state * k_t[..., None]).sum(dim=-2)  # Sᵀ·k_t: (B, Hv, dv)
        delta = (v_t - remembered) * beta[:, step, :, None]  # (B, Hv, dv)
        state = state + k_t[..., None] * delta[..., None, :]  # k_t ⊗ delta: (B, Hv, dk, dv)
        # 3. Read with the query.
        out[:, step] = (state * q_t[..., None]).sum(dim=-2)  # Sᵀ·q_t: (B, Hv, dv)
    return out


def chunked_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int = 64) -> Tensor:
    """``gated_delta_rule`` by chunks of ``chunk`` tokens (the DeltaNet papers' UT
    transform), in float32, step by step in transformers' order of float operations
    (its torch fallback, ``torch_chunk_gated_delta_rule``), so the hidden states round
    alike: each rounding difference in a linear layer grows through the layers after it
    (measured on the tiny checkpoint: token by token, 2e-5 off transformers' hidden states
    at layer 3; by chunks, as below, at float32 rounding).

    Within a chunk, the writes of its tokens to the state are solved at once: with
    Γ_ij = exp(Σ_{j<l≤i} g_l) the decay between tokens j and i,

        U = (I + strictly_lower(βKKᵀ ⊙ Γ))⁻¹       (a unit lower-triangular solve)
        values to write  u = U·(β ⊙ V),   decayed keys w = U·(β ⊙ K ⊙ exp(cum g))
        o_chunk = (Q ⊙ exp(cum g))·S + ((QKᵀ ⊙ Γ) masked causal)·(u - w·S)
        S       = exp(Σ g)·S + (K ⊙ exp(Σg - cum g))ᵀ·(u - w·S)

    Args and returns as ``gated_delta_rule``.
    """
    b, t, h, dk = k.shape
    dv = v.size(-1)
    q, k, v = (x.transpose(1, 2).float().contiguous() for x in (q, k, v))  # (B, Hv, T, ·)
    beta, decay = (x.transpose(1, 2).float().contiguous() for x in (beta, g))  # (B, Hv, T)
    # 1. Pad T to whole chunks (padding writes nothing: β = 0, g = 0).
    pad = (chunk - t % chunk) % chunk
    q, k, v = (nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, decay = (nn.functional.pad(x, (0, pad)) for x in (beta, decay))
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(b, h, -1, chunk, x.size(-1)) for x in (q, k, k_beta, v_beta))  # (B, Hv, N, C, ·)
    decay = decay.reshape(b, h, -1, chunk)  # (B, Hv, N, C)
    # 2. Within each chunk: the decays Γ between its tokens, the UT system and its solves.
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)  # (C, C): j after i
    cum = decay.cumsum(dim=-1)  # (B, Hv, N, C): log decay from the chunk's start
    gamma = (cum[..., :, None] - cum[..., None, :]).masked_fill(later, float("-inf")).exp()  # (B, Hv, N, C, C)
    system = (k_beta @ k.transpose(-1, -2)) * gamma  # (B, Hv, N, C, C)
    intra = (q @ k.transpose(-1, -2)) * gamma  # (B, Hv, N, C, C): causal within the chunk
    decayed_k_beta = k_beta * cum.exp()[..., None]
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)  # (B, Hv, N, C, dv)
    w = torch.linalg.solve_triangular(system, decayed_k_beta, upper=False, unitriangular=True)  # (B, Hv, N, C, dk)
    state = q.new_zeros(b, h, dk, dv)  # S
    out = torch.zeros_like(u)  # (B, Hv, N, C, dv)
    q = q * cum.exp()[..., None]
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]  # (B, Hv, N, 1, 1)
    # 3. Chunk by chunk: read the state, write the chunk's corrections into it.
    for i in range(q.size(2)):
        new = u[:, :, i] - w[:, :, i] @ state  # (B, Hv, C, dv)
        out[:, :, i] = q[:, :, i] @ state + intra[:, :, i] @ new
        state = state * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ new
    # Contiguous, as transformers returns it: the norm after sums each row in memory order.
    return out.reshape(b, h, -1, dv)[:, :, :t].transpose(1, 2).contiguous()  # (B, T, Hv, dv)


class GatedDeltaNet(nn.Module):
    """One linear-attention layer (module docstring); no attention weights."""

    def __init__(self, c: Qwen3NextConfig) -> None:
        super().__init__()
        self.hk, self.hv = c.linear_num_key_heads, c.linear_num_value_heads
        self.dk, self.dv = c.linear_key_head_dim, c.linear_value_head_dim
        key_dim, value_dim = self.hk * self.dk, self.hv * self.dv
        self.key_dim, self.value_dim = key_dim, value_dim
        channels = 2 * key_dim + value_dim
        self.grouped = c.projections == "grouped"
        if self.grouped:
            self.in_proj_qkvz = nn.Linear(c.hidden_size, 2 * key_dim + 2 * value_dim, bias=False)
            self.in_proj_ba = nn.Linear(c.hidden_size, 2 * self.hv, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(c.hidden_size, channels, bias=False)
            self.in_proj_z = nn.Linear(c.hidden_size, value_dim, bias=False)
            self.in_proj_b = nn.Linear(c.hidden_size, self.hv, bias=False)
            self.in_proj_a = nn.Linear(c.hidden_size, self.hv, bias=False)
        self.conv1d = nn.Conv1d(channels, channels, c.linear_conv_kernel_dim, groups=channels, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, c.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, c.hidden_size, bias=False)
        self.act = activation(c.hidden_act)

    def forward(self, x: Tensor, padding: Tensor | None = None) -> Tensor:
        """x (B, T, E), padding (B, T) boolean (True = real token) -> (B, T, E)."""
        if padding is not None:
            x = x * padding[:, :, None].to(x.dtype)  # padding tokens write nothing into the state
        b, t, _ = x.shape
        r = self.hv // self.hk  # value heads per query/key head
        # 1. Projections: Qwen3-Next's laid out per key head, [q | k | v (r heads) | z (r heads)]
        #    and [b (r) | a (r)]; Qwen3.5's apart, q, k, v of every head side by side.
        if self.grouped:
            qkvz = self.in_proj_qkvz(x).view(b, t, self.hk, 2 * self.dk + 2 * r * self.dv)
            q, k, v, z = qkvz.split([self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
            beta_in, a = self.in_proj_ba(x).view(b, t, self.hk, 2 * r).split([r, r], dim=-1)
            mixed = torch.cat((q.reshape(b, t, -1), k.reshape(b, t, -1), v.reshape(b, t, -1)), dim=-1)  # (B, T, C)
        else:
            mixed = self.in_proj_qkv(x)  # (B, T, C): [q | k | v]
            z, beta_in, a = self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)
        # 2. The causal depthwise convolution over q, k, v (each channel its own kernel).
        kernel = self.conv1d.kernel_size[0]
        mixed = nn.functional.conv1d(
            mixed.transpose(1, 2), self.conv1d.weight, padding=kernel - 1, groups=mixed.size(-1)
        )[:, :, :t]  # (B, C, T): position t sees t-kernel+1..t
        mixed = self.act(mixed).transpose(1, 2)  # (B, T, C)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(b, t, self.hk, self.dk).repeat_interleave(r, dim=2)  # (B, T, Hv, dk)
        k = k.reshape(b, t, self.hk, self.dk).repeat_interleave(r, dim=2)  # (B, T, Hv, dk)
        v = v.reshape(b, t, self.hv, self.dv)  # (B, T, Hv, dv)
        # 3. Write strength and decay per value head.
        beta = torch.sigmoid(beta_in.reshape(b, t, self.hv))  # (B, T, Hv)
        g = -self.A_log.float().exp() * nn.functional.softplus(a.reshape(b, t, self.hv).float() + self.dt_bias)
        # 4. The recurrence, q and k unit length, q scaled by d_k^(-1/2), in float32.
        q, k = l2norm(q.float()), l2norm(k.float())
        out = chunked_gated_delta_rule(q * self.dk**-0.5, k, v, g, beta).to(x.dtype)  # (B, T, Hv, dv)
        # 5. Normed and gated per value head, then out of the heads.
        out = self.norm(out, z.reshape(b, t, self.hv, self.dv))  # (B, T, Hv, dv)
        return self.out_proj(out.reshape(b, t, self.value_dim))  # (B, T, E)


class LinearBlock(nn.Module):
    """A pre-norm layer whose token mixer is a Gated DeltaNet."""

    def __init__(self, linear_attn: GatedDeltaNet, attn_norm: nn.Module, mlp: nn.Module, mlp_norm: nn.Module) -> None:
        super().__init__()
        self.attn_norm, self.linear_attn = attn_norm, linear_attn
        self.mlp_norm, self.mlp = mlp_norm, mlp

    def forward(self, x: Tensor, padding: Tensor | None) -> Tensor:
        # The token mixer's output passes the layer's attn_out tap, as a softmax layer's does.
        x = x + tap("attn_out", self.linear_attn(self.attn_norm(x), padding))
        return x + tap("mlp_out", self.mlp(self.mlp_norm(x)))


class Qwen3NextDecoder(HybridDecoder):
    config: Qwen3NextConfig
    mixer = "linear-attention"

    def softmax_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.config.layer_types) if kind == "full_attention")

    def make_norm(self, dim: int) -> nn.Module:
        return GemmaRMSNorm(dim, self.config.rms_norm_eps)

    def make_attention(self, layer: int) -> MultiHeadAttention:
        c = self.config
        return GatedAttention(
            c.hidden_size,
            c.num_attention_heads,
            **attention_options(c),
            q_norm=GemmaRMSNorm(c.head_dim, c.rms_norm_eps),
            k_norm=GemmaRMSNorm(c.head_dim, c.rms_norm_eps),
        )

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        if layer not in c.sparse_layers:
            return SwiGLU(c.hidden_size, c.intermediate_size, c.hidden_act)
        routed = SparseMoE(
            c.hidden_size, c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok, c.hidden_act, c.norm_topk_prob
        )
        return SharedExpertMoE(routed, c.hidden_size, c.shared_expert_intermediate_size, c.hidden_act)

    def make_block(self, layer: int) -> nn.Module:
        e = self.config.hidden_size
        if self.config.layer_types[layer] == "linear_attention":
            return LinearBlock(GatedDeltaNet(self.config), self.make_norm(e), self.make_mlp(layer), self.make_norm(e))
        return PreNormBlock(self.make_attention(layer), self.make_norm(e), self.make_mlp(layer), self.make_norm(e))


# transformers' class defaults that differ between the three (absent keys read as these).
_DEFAULTS: dict[str, dict[str, int]] = {
    "qwen3_next": {"num_hidden_layers": 48, "num_experts": 512, "num_experts_per_tok": 10},
    "qwen3_5_text": {"num_hidden_layers": 32, "num_experts": 0, "num_experts_per_tok": 1},
    "qwen3_5_moe_text": {"num_hidden_layers": 40, "num_experts": 256, "num_experts_per_tok": 8},
}


def build(config: dict[str, Any]) -> Qwen3NextDecoder:
    model_type = str(given(config, "model_type", "qwen3_next"))
    defaults = _DEFAULTS.get(model_type, _DEFAULTS["qwen3_next"])
    # Absent keys read as transformers' config classes default them (0 and [] are values).
    layers = whole(config, "num_hidden_layers", defaults["num_hidden_layers"])
    interval = whole(config, "full_attention_interval", 4)
    types = tuple(
        sequence(
            config,
            "layer_types",
            ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)],
        )
    )
    head_dim = whole(config, "head_dim", 256)
    params = dict(config)
    nested = config.get("rope_parameters")
    if not (isinstance(nested, dict) and nested.get("partial_rotary_factor") is not None):
        params["partial_rotary_factor"] = fraction(config, "partial_rotary_factor", 0.25)
    rope = rope_config(params, head_dim, partial_rotary=True)
    if model_type == "qwen3_5_text":
        experts, sparse = 0, tuple[int, ...]()  # dense SwiGLU in every layer
    elif model_type == "qwen3_5_moe_text":
        experts = whole(config, "num_experts", defaults["num_experts"])
        sparse = tuple(range(layers))  # the experts in every layer
    else:
        experts = whole(config, "num_experts", defaults["num_experts"], low=0)
        step = whole(config, "decoder_sparse_step", 1)
        dense = {int(i) for i in sequence(config, "mlp_only_layers", [])}
        sparse = tuple(i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
    bias = bool(given(config, "attention_bias", False))
    base = LlamaConfig.from_dict(
        config,
        head_dim=head_dim,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=False,
        ropes=(rope,) * layers,
        windows=(None,) * layers,
    )
    return Qwen3NextDecoder(
        Qwen3NextConfig(
            **vars(base),
            layer_types=types,
            linear_num_key_heads=whole(config, "linear_num_key_heads", 16),
            linear_num_value_heads=whole(config, "linear_num_value_heads", 32),
            linear_key_head_dim=whole(config, "linear_key_head_dim", 128),
            linear_value_head_dim=whole(config, "linear_value_head_dim", 128),
            linear_conv_kernel_dim=whole(config, "linear_conv_kernel_dim", 4),
            num_experts=experts,
            num_experts_per_tok=whole(config, "num_experts_per_tok", defaults["num_experts_per_tok"]),
            moe_intermediate_size=whole(config, "moe_intermediate_size", 512),
            shared_expert_intermediate_size=whole(config, "shared_expert_intermediate_size", 512),
            # Qwen3.5-MoE renormalises the top-k always; it has no such key.
            norm_topk_prob=model_type == "qwen3_5_moe_text" or bool(given(config, "norm_topk_prob", True)),
            sparse_layers=sparse,
            projections="grouped" if model_type == "qwen3_next" else "split",
        )
    )


RULES = (
    (r"embed_tokens\.weight", r"tokens.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2_proj.\3"),  # q: split in convert
    (r"layers\.(\d+)\.self_attn\.([qk])_norm\.weight", r"blocks.\1.attn.\2_norm.weight"),
    # The Gated DeltaNet's parameters keep their names (in_proj_*, conv1d, dt_bias, A_log, norm, out_proj).
    (r"layers\.(\d+)\.linear_attn\.([\w.]+)", r"blocks.\1.linear_attn.\2"),
    (r"layers\.(\d+)\.mlp\.shared_expert\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.shared.\2.weight"),
    (r"layers\.(\d+)\.mlp\.shared_expert_gate\.weight", r"blocks.\1.mlp.shared_gate.weight"),
    (r"layers\.(\d+)\.mlp\.gate\.weight", r"blocks.\1.mlp.routed.router.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.routed.experts.\2.\3.weight"),
    (r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", r"blocks.\1.mlp.routed.experts.\2"),
    (r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
    (r"norm\.weight", r"final_norm.weight"),
)


def convert(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """q_proj (H·2D, ·), each head's [q_h | gate_h] rows side by side, into our q_proj and
    gate_proj (H·D, ·) each; fused experts split (moe.py)."""
    heads = int(config["num_attention_heads"])
    out: dict[str, Tensor] = {}
    for name, tensor in moe_convert(tensors, config).items():
        if ".attn.q_proj." in name:
            per_head = tensor.view(heads, 2, -1, *tensor.shape[1:])  # (H, 2, D, ...)
            out[name] = per_head[:, 0].reshape(-1, *tensor.shape[1:]).contiguous()
            out[name.replace(".q_proj.", ".gate_proj.")] = per_head[:, 1].reshape(-1, *tensor.shape[1:]).contiguous()
        else:
            out[name] = tensor
    return out
